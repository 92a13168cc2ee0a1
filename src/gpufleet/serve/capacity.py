"""Punica as a capacity model: the tokens/s a GPU serves for many LoRA adapters, and the inference servers a
request load needs with Punica-style batching versus one adapter at a time.

**Decode step (roofline).** Decoding is memory-bound: every step reads all weights once for the whole batch. A
step of ``batch`` requests whose rows use ``distinct`` rank-``r`` adapters, each with ``context`` tokens of KV:

* bytes  = weights (every linear layer and the LM head) + ``distinct`` x one adapter's A and B matrices on all
  seven projections (q, k, v, o, gate, up, down, as Punica's and gpufleet's models apply them)
  + ``batch`` x ``context`` x KV bytes per token;
* FLOPs  = ``batch`` x (2 x linear parameters + 2 x one adapter's parameters + 4 x layers x q-width x context);
* time   = max(bytes / (memory bandwidth x ``memory_efficiency``), FLOPs / (fp16 peak x ``compute_efficiency``)),
  with the bandwidth and fp16 dense peak of the GPU catalog (``gpufleet.spec``, NVIDIA datasheets).

tokens/s = batch / time. Batching amortises the weights: that is why one batch of 32 requests for 32 different
adapters (Punica's SGMV) serves many more tokens than 32 batches of one, which is what a server must do when it
can only batch requests of the same adapter. Each distinct adapter in a batch adds its bytes: Punica reports
"+2 ms latency per token" for its LoRA kernels (abstract of Chen et al., MLSys 2024, arXiv 2310.18547); the model
gives 1.6 ms for 32 distinct rank-16 adapters of Llama-2-7B on an A100-80GB.

**Constants, and what they are not.** ``memory_efficiency`` 0.8 and ``compute_efficiency`` 0.7 are the fractions
of peak that gpufleet's training performance model uses for memory-bound kernels and large GEMMs on Ampere
(``perf_efficiency.toml``); they are physical estimates, not fits to a serving measurement. The KV pool is Punica's
(``0.8 x GPU memory - weights - LoRA cache``, its cluster scheduler; 32 requests per GPU, a cache of 1.2 x 32 = 38
adapters). The default workload is Punica's benchmark: prompts lognormal with median 18 tokens, total length
uniform on [0, 2048), so outputs average 2048/2 - 18 = 1006 tokens and the KV that a running request holds,
averaged over its decode steps and weighted by them, is E[T^2] / (2 E[T]) = 2048/3 = 683 tokens. The result is a
roofline: an upper bound that real systems approach within a small factor. For Llama-2-7B with 32 distinct
rank-16 adapters at batch 32 on an A100-80GB it gives about 2,000 tokens/s; Punica's single-GPU text-generation
figure for that setting is of the order of 10^3 tokens/s (read from the paper's figure, not quoted to a digit),
and its headline is 12x the throughput of systems that batch one adapter at a time (the model: about 15x).

**Servers over time.** A request-rate profile (the bundled GenAI trace's shape, the diurnal cosine, or any
``InferenceLoad`` / load CSV, normalised to its peak and scaled to ``peak_rps`` requests/s) becomes GPUs needed:

* ``gpufleet`` (Punica): requests fill the busiest GPU first, so every GPU but one runs the full batch of 32 and
  GPUs = rate x (prefill + output x step(32) / 32) -- consolidation rather than spreading. Where every adapter
  alone has traffic enough to fill batches, mixing 32 adapters per batch costs their extra LoRA bytes for
  nothing; a Punica GPU may then hold one adapter's requests (placement's same-adapter tie-break), so gpufleet
  never needs more GPUs than per-adapter serving: it needs the smaller of the two;
* ``per_adapter``: a GPU runs one adapter at a time (time-sliced, switching for free: a favourable assumption),
  at the batch its own share of the traffic gives, found from Little's law: concurrency = rate_a x time in the
  system, batch = clip(concurrency, 1, 32).

Servers = ceil(GPUs x (1 + headroom) / GPUs per server), capped at the pool, as ``traces.inference.genai_load``
does. ``lora_inference_load`` returns the result as an ``InferenceLoad``, which the simulator loans from (Aryl):
the servers that Punica-style batching frees are idle servers to lend to training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from gpufleet.errors import ServeError
from gpufleet.serve.config import LlamaConfig
from gpufleet.spec import GPUSpec, get_gpu
from gpufleet.traces.inference import InferenceLoad, load_inference

System = Literal["gpufleet", "per_adapter"]
SYSTEMS: tuple[str, ...] = ("gpufleet", "per_adapter")
POPULARITIES: tuple[str, ...] = ("uniform", "zipf", "identical")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROFILE_RESOLUTION = 10_000  # servers of the pool a named profile is built for: shape resolution 1e-4
_EPS = 1e-9

SERVING_MODELS: dict[str, LlamaConfig] = {
    # meta-llama/Llama-2-7b-hf config.json (LlamaConfig's defaults are exactly this shape)
    "llama2-7b": LlamaConfig(),
    # meta-llama/Llama-2-13b-hf config.json
    "llama2-13b": LlamaConfig(
        hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40
    ),
    # meta-llama/Meta-Llama-3-8B config.json
    "llama3-8b": LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
    ),
    # meta-llama/Llama-3.2-3B config.json (tied embeddings)
    "llama3.2-3b": LlamaConfig(
        vocab_size=128256,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
    # meta-llama/Llama-3.2-1B config.json (tied embeddings)
    "llama3.2-1b": LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
    # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json
    "tinyllama-1.1b": LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    ),
}
"""Shapes of published Llama-family models (from each model's Hugging Face config.json)."""


# ------------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class Roofline:
    """Achievable fractions of the GPU's peaks, Punica's memory split, and the number format (bytes per value)."""

    memory_efficiency: float = 0.8
    compute_efficiency: float = 0.7
    memory_fraction: float = 0.8  # Punica: KV pool = 0.8 x GPU memory - weights - LoRA cache
    dtype_bytes: int = 2  # fp16, as Punica serves

    def __post_init__(self) -> None:
        for name in ("memory_efficiency", "compute_efficiency", "memory_fraction"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ServeError(f"Roofline.{name} must lie in (0, 1], got {value!r}")
        if self.dtype_bytes < 1:
            raise ServeError(f"Roofline.dtype_bytes must be at least 1, got {self.dtype_bytes!r}")


@dataclass(frozen=True)
class ServingWorkload:
    """Mean request shape: prompt and output tokens, and the KV context a running request holds (see module doc)."""

    prompt_tokens: float = 18.0
    output_tokens: float = 1006.0
    context_tokens: float = 683.0

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "output_tokens", "context_tokens"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ServeError(f"ServingWorkload.{name} must be a positive number of tokens, got {value!r}")


# ----------------------------------------------------------------------------------------------- model costs
@dataclass(frozen=True)
class ModelCosts:
    """Bytes and FLOPs of one model shape with rank-``rank`` adapters, in the roofline's number format."""

    weight_bytes: float  # read by every decode step: linear layers + LM head
    resident_bytes: float  # held on the GPU: the above + the embedding table when it is not tied
    adapter_bytes: float  # one adapter's A and B on the seven projections of every layer
    flops_per_token: float  # 2 x linear parameters (+ LM head)
    adapter_flops_per_token: float  # 2 x one adapter's parameters
    attention_flops_per_context_token: float  # Q.K and P.V: 4 x layers x q-width per token of context
    kv_bytes_per_token: float


def model_costs(model: LlamaConfig, rank: int, dtype_bytes: int = 2) -> ModelCosts:
    """The roofline's inputs for ``model`` with rank-``rank`` LoRA on all seven projections."""
    if rank < 1:
        raise ServeError(f"the LoRA rank must be at least 1, got {rank!r}")
    dims = model.projection_shapes().values()
    layers = model.num_hidden_layers
    linear = layers * sum(i * o for i, o in dims) + model.vocab_size * model.hidden_size
    embedding = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
    adapter = layers * rank * sum(i + o for i, o in dims)
    q_width = model.num_attention_heads * model.head_size
    return ModelCosts(
        weight_bytes=linear * dtype_bytes,
        resident_bytes=(linear + embedding) * dtype_bytes,
        adapter_bytes=adapter * dtype_bytes,
        flops_per_token=2.0 * linear,
        adapter_flops_per_token=2.0 * adapter,
        attention_flops_per_context_token=4.0 * layers * q_width,
        kv_bytes_per_token=model.kv_bytes_per_token(dtype_bytes),
    )


def resolve_model(model: str | LlamaConfig) -> LlamaConfig:
    """A model shape: a ``LlamaConfig``, a name of ``SERVING_MODELS``, or a Hugging Face folder's config.json."""
    if isinstance(model, LlamaConfig):
        return model
    if model in SERVING_MODELS:
        return SERVING_MODELS[model]
    try:
        return LlamaConfig.load(model)
    except ServeError:
        raise ServeError(
            f"model {model!r}: not one of {', '.join(SERVING_MODELS)} and not a folder with a config.json"
        ) from None


def resolve_gpu(gpu: str | GPUSpec) -> GPUSpec:
    """A GPU spec from the catalog (any accepted spelling) or as given."""
    return gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)


# ---------------------------------------------------------------------------------------------- decode step
@dataclass(frozen=True)
class DecodeStep:
    """One decode step's roofline: bytes moved, FLOPs, the two times and the step's duration."""

    batch: int
    distinct_adapters: int
    bytes: float
    flops: float
    memory_s: float
    compute_s: float

    @property
    def seconds(self) -> float:
        """The step's duration: the slower of memory and compute."""
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> str:
        """'memory' or 'compute': what limits the step."""
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second: one per request per step."""
        return self.batch / self.seconds


def _step_seconds(
    costs: ModelCosts,
    gpu: GPUSpec,
    roofline: Roofline,
    batch: np.ndarray | float,
    distinct: np.ndarray | float,
    context: float,
) -> tuple[Any, Any, Any, Any]:
    """(bytes, flops, memory seconds, compute seconds) of decode steps; works on NumPy arrays element-wise."""
    moved = costs.weight_bytes + distinct * costs.adapter_bytes + batch * context * costs.kv_bytes_per_token
    flops = batch * (
        costs.flops_per_token + costs.adapter_flops_per_token + context * costs.attention_flops_per_context_token
    )
    memory_s = moved / (gpu.memory_bw_gbps * 1e9 * roofline.memory_efficiency)
    compute_s = flops / (gpu.dense_fp16_tflops * 1e12 * roofline.compute_efficiency)
    return moved, flops, memory_s, compute_s


def decode_step(
    gpu: str | GPUSpec,
    model_shape: str | LlamaConfig,
    rank: int,
    distinct_adapters: int,
    batch: int,
    *,
    context_tokens: float = ServingWorkload.context_tokens,
    roofline: Roofline = Roofline(),
) -> DecodeStep:
    """The roofline of one decode step of ``batch`` requests over ``distinct_adapters`` adapters (see module doc)."""
    if batch < 1:
        raise ServeError(f"batch must be at least 1, got {batch!r}")
    if not 0 <= distinct_adapters <= batch:
        raise ServeError(
            f"distinct_adapters must lie in [0, batch={batch}] (a request uses at most one adapter), "
            f"got {distinct_adapters!r}"
        )
    costs = model_costs(resolve_model(model_shape), rank, roofline.dtype_bytes)
    moved, flops, memory_s, compute_s = _step_seconds(
        costs, resolve_gpu(gpu), roofline, float(batch), float(distinct_adapters), context_tokens
    )
    return DecodeStep(batch, distinct_adapters, moved, flops, memory_s, compute_s)


def lora_serving_throughput(
    gpu: str | GPUSpec,
    model_shape: str | LlamaConfig,
    rank: int,
    distinct_adapters: int,
    batch: int,
    *,
    context_tokens: float = ServingWorkload.context_tokens,
    roofline: Roofline = Roofline(),
) -> float:
    """Generated tokens/s of one GPU decoding ``batch`` requests for ``distinct_adapters`` rank-``rank`` adapters.

    ``gpu`` is a catalog name (``a100-80g``) or spec, ``model_shape`` a name of ``SERVING_MODELS``, a model folder
    or a ``LlamaConfig``. Does not check that the batch fits in memory (see ``max_batch_that_fits``).
    """
    return decode_step(
        gpu, model_shape, rank, distinct_adapters, batch, context_tokens=context_tokens, roofline=roofline
    ).tokens_per_s


def max_batch_that_fits(
    gpu: str | GPUSpec,
    model_shape: str | LlamaConfig,
    rank: int,
    *,
    adapter_slots: int = 38,
    context_tokens: float = ServingWorkload.context_tokens,
    roofline: Roofline = Roofline(),
) -> int:
    """Requests whose KV fits beside the weights and ``adapter_slots`` cached adapters (Punica's memory split).

    ServeError when not even the weights fit, naming the models of ``SERVING_MODELS`` that would.
    """
    spec, model = resolve_gpu(gpu), resolve_model(model_shape)
    costs = model_costs(model, rank, roofline.dtype_bytes)
    pool = roofline.memory_fraction * spec.memory_bytes - costs.resident_bytes - adapter_slots * costs.adapter_bytes
    batch = int(pool // (context_tokens * costs.kv_bytes_per_token)) if pool > 0 else 0
    if batch < 1:
        fitting = [name for name, shape in SERVING_MODELS.items() if _fits(spec, shape, rank, roofline)]
        raise ServeError(
            f"the model ({costs.resident_bytes / 1e9:.1f} GB of weights) and {adapter_slots} rank-{rank} "
            f"adapters leave no room for a request's KV in {roofline.memory_fraction:g} x "
            f"{spec.memory_gb:g} GB of {spec.name}; choose a smaller model "
            f"({', '.join(fitting) or 'none of the catalogued ones fits'}) or a larger GPU"
        )
    return batch


def _fits(gpu: GPUSpec, model: LlamaConfig, rank: int, roofline: Roofline) -> bool:
    costs = model_costs(model, rank, roofline.dtype_bytes)
    pool = roofline.memory_fraction * gpu.memory_bytes - costs.resident_bytes - 38 * costs.adapter_bytes
    return pool >= ServingWorkload.context_tokens * costs.kv_bytes_per_token


# ------------------------------------------------------------------------------------------- adapter traffic
def adapter_shares(adapters: int, popularity: str = "uniform", zipf_alpha: float = 1.5) -> np.ndarray:
    """Each adapter's share of the requests: equal, Zipf(``zipf_alpha``) by rank, or all on one adapter.

    Punica's "Skewed" workload approximates Zipf with alpha 1.5 (its ``zipf:1.5``); "uniform" and "identical" are
    its other two shapes over a population of adapters.
    """
    if adapters < 1:
        raise ServeError(f"adapters must be at least 1, got {adapters!r}")
    if popularity == "uniform":
        return np.full(adapters, 1.0 / adapters)
    if popularity == "zipf":
        weights = 1.0 / np.arange(1, adapters + 1, dtype=np.float64) ** zipf_alpha
        return weights / weights.sum()
    if popularity == "identical":
        return np.ones(1)
    raise ServeError(f"popularity {popularity!r}: choose one of {', '.join(POPULARITIES)}")


def expected_distinct(batch: np.ndarray | float, shares: np.ndarray) -> np.ndarray:
    """Expected distinct adapters among ``batch`` requests drawn with ``shares``: sum of 1 - (1 - p)^batch."""
    b = np.asarray(batch, dtype=np.float64)
    return np.sum(1.0 - (1.0 - shares) ** b[..., None], axis=-1)


@dataclass(frozen=True)
class LoRAServingModel:
    """A pool serving ``adapters`` rank-``rank`` adapters of one base model on one GPU kind: GPUs per request rate.

    ``max_batch`` is Punica's 32 requests per GPU (less where the KV does not fit); ``adapter_slots`` its cache
    of 1.2 x 32 = 38 adapters per GPU. The default population, 1,000 adapters with Zipf(1.5) popularity (Punica's
    "Skewed" shape), is illustrative: no published production mix of adapters exists to take it from; S-LoRA
    serves 2,000 adapters on one A100-80GB, Punica targets "hundreds".
    """

    gpu: str | GPUSpec = "a100-80g"
    model: str | LlamaConfig = "llama2-7b"
    rank: int = 16
    adapters: int = 1000
    popularity: str = "zipf"
    zipf_alpha: float = 1.5
    max_batch: int = 32
    adapter_slots: int = 38
    workload: ServingWorkload = field(default_factory=ServingWorkload)
    roofline: Roofline = field(default_factory=Roofline)

    def spec(self) -> GPUSpec:
        return resolve_gpu(self.gpu)

    def costs(self) -> ModelCosts:
        return model_costs(resolve_model(self.model), self.rank, self.roofline.dtype_bytes)

    def batch_cap(self) -> int:
        """The batch a GPU runs when full: ``max_batch``, or fewer where the KV cache is smaller."""
        fit = max_batch_that_fits(
            self.spec(),
            resolve_model(self.model),
            self.rank,
            adapter_slots=self.adapter_slots,
            context_tokens=self.workload.context_tokens,
            roofline=self.roofline,
        )
        return min(self.max_batch, fit)

    def shares(self) -> np.ndarray:
        return adapter_shares(self.adapters, self.popularity, self.zipf_alpha)

    def gpus_needed(self, requests_per_s: np.ndarray | float, system: str = "gpufleet") -> np.ndarray:
        """GPUs (fractional, before headroom) that serve ``requests_per_s`` with ``system`` (see module doc)."""
        rate = np.asarray(requests_per_s, dtype=np.float64)
        if np.any(~np.isfinite(rate)) or np.any(rate < 0):
            raise ServeError("request rates must be finite and >= 0")
        if system not in SYSTEMS:
            raise ServeError(f"system {system!r}: choose one of {', '.join(SYSTEMS)}")
        shares = self.shares()
        per_adapter = self._gpus(rate[..., None] * shares, np.ones(1)).sum(axis=-1)
        if system == "per_adapter":
            return per_adapter
        return np.minimum(self._gpus(rate, shares), per_adapter)

    def _gpus(self, rate: np.ndarray, shares: np.ndarray) -> np.ndarray:
        """GPUs for traffic ``rate`` over adapters with ``shares``, batched together, at Little's-law batch size."""
        costs, spec, work, cap = self.costs(), self.spec(), self.workload, self.batch_cap()
        peak = spec.dense_fp16_tflops * 1e12 * self.roofline.compute_efficiency
        prefill_s = (
            work.prompt_tokens
            * (
                costs.flops_per_token
                + costs.adapter_flops_per_token
                + work.prompt_tokens / 2 * costs.attention_flops_per_context_token
            )
            / peak
        )
        batch = np.ones_like(rate)
        for _ in range(200):  # fixed point of batch = clip(rate x time in system, 1, cap): monotone from below
            step = self._step(costs, spec, batch, shares)
            new = np.clip(rate * (prefill_s + work.output_tokens * step), 1.0, cap)
            if np.allclose(new, batch, rtol=1e-6, atol=1e-9):
                batch = new
                break
            batch = new
        step = self._step(costs, spec, batch, shares)
        return rate * (prefill_s + work.output_tokens * step / batch)

    def _step(self, costs: ModelCosts, spec: GPUSpec, batch: np.ndarray, shares: np.ndarray) -> np.ndarray:
        distinct = expected_distinct(batch, shares)
        _, _, memory_s, compute_s = _step_seconds(
            costs, spec, self.roofline, batch, distinct, self.workload.context_tokens
        )
        return np.maximum(memory_s, compute_s)


# ------------------------------------------------------------------------------------------ servers over time
def request_rate_shape(
    rate_profile: str | InferenceLoad = "genai", *, until_s: float, **profile_opts: Any
) -> InferenceLoad:
    """The profile's shape as a load on a pool of ``PROFILE_RESOLUTION`` servers (its peak step = the whole pool).

    ``rate_profile``: "genai" (the bundled Alibaba GenAI trace, scaled to its own maximum: ``headroom=0``,
    ``peak_quantile=1``), "diurnal", a load CSV, or an ``InferenceLoad`` used as it is. ``profile_opts`` go to
    ``traces.inference.load_inference`` (e.g. ``step_s=300``).
    """
    if isinstance(rate_profile, InferenceLoad):
        return rate_profile
    opts = dict(profile_opts)
    if str(rate_profile).strip().lower() == "genai":
        opts.setdefault("headroom", 0.0)
        opts.setdefault("peak_quantile", 1.0)
    return load_inference(rate_profile, pool_servers=PROFILE_RESOLUTION, until_s=until_s, **opts)


def _servers(gpus: np.ndarray, gpus_per_server: int, headroom: float, pool_servers: int) -> np.ndarray:
    needed = np.ceil(gpus * (1.0 + headroom) / gpus_per_server - _EPS)
    return np.clip(needed, 0, pool_servers).astype(np.int64)


def peak_rps_for_pool(
    serving: LoRAServingModel,
    pool_servers: int,
    *,
    gpus_per_server: int = 8,
    headroom: float = 0.2,
    system: str = "per_adapter",
) -> float:
    """The request rate at which ``system`` needs exactly the whole pool (bisection; GPUs grow with the rate)."""
    target = pool_servers * gpus_per_server / (1.0 + headroom)
    if target <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while float(serving.gpus_needed(hi, system)) < target:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            raise ServeError("no request rate fills the pool; check the serving model's numbers")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(serving.gpus_needed(mid, system)) < target else (lo, mid)
    return lo


def lora_inference_load(
    rate_profile: str | InferenceLoad = "genai",
    *,
    pool_servers: int,
    until_s: float,
    serving: LoRAServingModel | None = None,
    system: str = "gpufleet",
    peak_rps: float | None = None,
    gpus_per_server: int = 8,
    headroom: float = 0.2,
    **profile_opts: Any,
) -> InferenceLoad:
    """Inference servers needed over time to serve a LoRA request-rate profile with ``system``.

    The profile (see ``request_rate_shape``) is normalised to its peak and scaled to ``peak_rps`` requests/s; by
    default ``peak_rps`` is the rate at which *per-adapter* serving needs the whole pool at the peak
    (``peak_rps_for_pool``): the pool is sized for serving one adapter at a time, and the ``gpufleet`` load shows
    the servers that Punica-style batching leaves idle for loaning. The load's name is ``"<system>:<profile>"``.
    """
    serving = serving or LoRAServingModel()
    if system not in SYSTEMS:
        raise ServeError(f"system {system!r}: choose one of {', '.join(SYSTEMS)}")
    if not (math.isfinite(headroom) and headroom >= 0):
        raise ServeError(f"headroom must be >= 0 (0.2 = 20 % spare), got {headroom!r}")
    if gpus_per_server < 1:
        raise ServeError(f"gpus_per_server must be at least 1, got {gpus_per_server!r}")
    shape = request_rate_shape(rate_profile, until_s=until_s, **profile_opts)
    level = shape.servers / max(int(shape.servers.max()), 1)
    if peak_rps is None:
        peak_rps = peak_rps_for_pool(serving, pool_servers, gpus_per_server=gpus_per_server, headroom=headroom)
    if not (math.isfinite(peak_rps) and peak_rps >= 0):
        raise ServeError(f"peak_rps must be a finite rate >= 0 (requests/s), got {peak_rps!r}")
    unique, inverse = np.unique(level, return_inverse=True)  # a few thousand levels at most
    gpus = serving.gpus_needed(unique * peak_rps, system)[inverse]
    servers = _servers(gpus, gpus_per_server, headroom, pool_servers)
    return InferenceLoad(f"{system}:{shape.name}", shape.time_s, servers, pool_servers)


def lora_serving_loads(
    rate_profile: str | InferenceLoad = "genai",
    *,
    pool_servers: int,
    until_s: float,
    serving: LoRAServingModel | None = None,
    peak_rps: float | None = None,
    gpus_per_server: int = 8,
    headroom: float = 0.2,
    **profile_opts: Any,
) -> dict[str, InferenceLoad]:
    """Both systems' loads for the same traffic (the same ``peak_rps``), keyed by system."""
    serving = serving or LoRAServingModel()
    if peak_rps is None:
        peak_rps = peak_rps_for_pool(serving, pool_servers, gpus_per_server=gpus_per_server, headroom=headroom)
    return {
        system: lora_inference_load(
            rate_profile,
            pool_servers=pool_servers,
            until_s=until_s,
            serving=serving,
            system=system,
            peak_rps=peak_rps,
            gpus_per_server=gpus_per_server,
            headroom=headroom,
            **profile_opts,
        )
        for system in SYSTEMS
    }
