"""A training job as ``gpufleet perf step`` and ``gpufleet plan`` describe it, resolved into the performance
model's objects: the model shape, the system (GPU, NIC, node shape), the global batch, the training options and
the layout, each checked with an error that names the option to change. :func:`estimate` and :func:`plan` are
what the two commands compute."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.errors import ConfigError

if TYPE_CHECKING:
    from gpufleet.perf.efficiency import Efficiency
    from gpufleet.perf.model_spec import ModelSpec
    from gpufleet.perf.options import Layout, TrainOptions
    from gpufleet.perf.step import StepEstimate
    from gpufleet.perf.system import System
    from gpufleet.spec import ClusterSpec

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_NIC",
    "LayoutRequest",
    "PerfRequest",
    "PlanOutcome",
    "catalog_rows",
    "derive_layout",
    "estimate",
    "parse_tokens",
    "plan",
]

DEFAULT_GPU = "a100-80g"
DEFAULT_NIC = "ib-hdr"
_SUFFIX = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_tokens(text: str) -> int:
    """'16M' -> 16 x 2**20 tokens; K, M and G are binary multiples (the '4M tokens' of LLM papers)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]?)\s*", str(text))
    if not match:
        raise ConfigError(f"--gbs-tokens {text!r} is not a token count; write e.g. 4194304, 4096K, 16M or 1G")
    value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if value < 1:
        raise ConfigError(f"--gbs-tokens {text!r} must be at least one token")
    return int(value)


@dataclass(frozen=True)
class PerfRequest:
    """Model, hardware, batch and software of a training job; None means the default (or the catalog model's)."""

    model: str | Path | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    vocab: int | None = None
    seq: int | None = None
    glu: bool | None = None
    gpu: str | None = None
    gpus_per_node: int | None = None
    nic: str | None = None
    nics_per_node: int | None = None
    cluster: Path | None = None
    pool: str | None = None
    gbs: int | None = None
    gbs_tokens: str | None = None
    precision: str = "bf16"
    zero: int = 1
    flash: bool = True
    sp: bool = True
    megascale: bool = False
    tp_overlap: bool = False
    dp_overlap: bool = False
    causal_flops: bool = False
    efficiency: Path | None = None
    stack: str | None = None
    recompute_modules: tuple[str, ...] = ()

    def model_spec(self) -> ModelSpec:
        """The catalog model or file, with any shape field overridden."""
        from gpufleet.perf.model_spec import load_model

        return load_model(
            self.model,
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            kv_heads=self.kv_heads,
            ffn_hidden=self.ffn_hidden,
            vocab=self.vocab,
            seq=self.seq,
            glu=self.glu,
        )

    def cluster_spec(self) -> ClusterSpec | None:
        """The --cluster file, or None; it excludes --gpu/--nic/--gpus-per-node/--nics-per-node."""
        if self.cluster is None:
            if self.pool:
                raise ConfigError("--pool picks a pool of a --cluster file; pass --cluster too")
            return None
        if any(v is not None for v in (self.gpu, self.nic, self.gpus_per_node, self.nics_per_node)):
            raise ConfigError(
                "--cluster sets the GPU, NIC and node shape from its pool; "
                "drop --gpu/--nic/--gpus-per-node/--nics-per-node or drop --cluster"
            )
        from gpufleet.spec import load_cluster

        return load_cluster(self.cluster)

    def system(self, cluster: ClusterSpec | None) -> System:
        """The GPU, NIC and node shape: from ``cluster``'s pool, else from the flags and their defaults."""
        from gpufleet.perf.system import System

        if cluster is not None:
            return System.from_cluster(cluster, self.pool)
        return System.build(
            self.gpu or DEFAULT_GPU, self.nic or DEFAULT_NIC, self.gpus_per_node or 8, self.nics_per_node or 8
        )

    def global_batch(self, seq: int) -> int:
        """The global batch in sequences, from --gbs or --gbs-tokens (exactly one of them)."""
        if (self.gbs is None) == (self.gbs_tokens is None):
            raise ConfigError("give the global batch exactly once: --gbs SEQUENCES or --gbs-tokens TOKENS (e.g. 16M)")
        if self.gbs is not None:
            if self.gbs < 1:
                raise ConfigError(f"--gbs {self.gbs} must be at least 1 sequence")
            return int(self.gbs)
        n = parse_tokens(self.gbs_tokens)
        if n < seq:
            raise ConfigError(f"--gbs-tokens {self.gbs_tokens} is less than one sequence of {seq} tokens")
        return n // seq

    def options(self, megascale: bool | None = None) -> TrainOptions:
        """Training options; ``megascale`` overrides the request's MegaScale switch."""
        from gpufleet.perf.options import TrainOptions

        common: dict[str, Any] = {
            "precision": _value(self.precision or "bf16"),
            "zero": int(self.zero),
            "flash_attention": bool(self.flash),
            "sequence_parallel": bool(self.sp),
            "causal_flops": bool(self.causal_flops),
        }
        if self.tp_overlap:
            common["tp_overlap"] = True
        if self.dp_overlap:
            common["dp_overlap"] = True
        if self.stack:  # the stack's usual settings (FSDP: ZeRO-3, no SP), then the stack itself
            from gpufleet.perf.stacks import get_stack

            common.update(get_stack(self.stack).options)
            common["stack"] = self.stack
        if self.recompute_modules:  # Megatron-Core's --recompute-modules under selective recompute (memory)
            known = ("mla_up_proj", "mlp")
            unknown = [m for m in self.recompute_modules if m not in known]
            if unknown:
                raise ConfigError(
                    f"--recompute-module {unknown[0]!r} is not modelled; give one of {', '.join(known)} (repeatable)"
                )
            common["recompute_modules"] = tuple(dict.fromkeys(self.recompute_modules))
        use_megascale = self.megascale if megascale is None else megascale
        return TrainOptions.megascale(**common) if use_megascale else TrainOptions(**common)

    def efficiency_constants(self) -> Efficiency | None:
        """The --efficiency constants, or None for the shipped ones."""
        if self.efficiency is None:
            return None
        from gpufleet.perf.efficiency import load_efficiency

        return load_efficiency(self.efficiency)


@dataclass(frozen=True)
class LayoutRequest:
    """The parallel layout as given: DP None is derived from the GPU count."""

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    cp: int = 1
    mbs: int = 1
    vp: int = 1
    recompute: str = "none"
    ep: int = 1


def _value(x: Any) -> Any:
    """An Enum member's value, anything else unchanged."""
    return getattr(x, "value", x)


def derive_layout(model: ModelSpec, gpus: int, gbs: int, req: LayoutRequest) -> Layout:
    """The layout of ``req`` on ``gpus`` GPUs (DP derived when not given), or a ConfigError naming every rule the
    layout breaks."""
    from gpufleet.perf.options import Layout
    from gpufleet.perf.step import layout_problems

    knobs = {
        "tp": req.tp,
        "pp": req.pp,
        "cp": req.cp,
        "mbs": req.mbs,
        "vp": req.vp,
        "recompute": _value(req.recompute or "none"),
        "ep": req.ep,
    }
    for key in ("tp", "pp", "cp", "mbs", "vp", "ep"):
        if knobs[key] < 1:
            raise ConfigError(f"--{key} must be at least 1, got {knobs[key]}")
    dp = req.dp
    if dp is None:
        rest = knobs["tp"] * knobs["pp"] * knobs["cp"]
        if gpus % rest:
            # say why DP cannot be derived, and everything else wrong with the layout at once
            others = layout_problems(model, rest, gbs, Layout(dp=1, **knobs))
            raise ConfigError(
                f"layout TP{knobs['tp']} PP{knobs['pp']} CP{knobs['cp']} is invalid: {gpus} GPUs are not a multiple "
                f"of TP x PP x CP = {rest}, so DP cannot be derived (change --gpus or pass --dp)"
                + "".join(f"; {p}" for p in others)
            )
        dp = gpus // rest
    elif dp < 1:
        raise ConfigError(f"--dp must be at least 1, got {dp}")
    layout = Layout(dp=dp, **knobs)
    # estimate_step checks the layout against its own GPU count; check it against --gpus here
    problems = layout_problems(model, gpus, gbs, layout)
    if problems:
        raise ConfigError(f"layout {layout.describe()} is invalid: " + "; ".join(problems))
    return layout


def estimate(req: PerfRequest, gpus: int, layout: LayoutRequest, megascale: bool | None = None) -> StepEstimate:
    """One training step of ``layout`` on ``gpus`` GPUs; ``megascale`` overrides the request's switch."""
    from gpufleet.perf.step import estimate_step

    model = req.model_spec()
    system = req.system(req.cluster_spec())
    if gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {gpus}")
    gbs = req.global_batch(model.seq)
    chosen = derive_layout(model, gpus, gbs, layout)
    return estimate_step(
        model, system, chosen, gbs, options=req.options(megascale), efficiency=req.efficiency_constants()
    )


@dataclass(frozen=True)
class PlanOutcome:
    """A layout search: homogeneous (``result`` from ``plan_layouts``, with the system and batch it ran on) or,
    on a cluster whose training pools use different NICs, heterogeneous (``hetero`` from ``plan_hetero``)."""

    model: ModelSpec
    gbs: int
    options: TrainOptions
    result: Any = None
    system: System | None = None
    gpus: int | None = None
    hetero: Any = None
    cluster: ClusterSpec | None = None


def plan(
    req: PerfRequest,
    gpus: int | None,
    top: int = 10,
    recompute: tuple[str, ...] | None = None,
    max_tp: int | None = None,
    max_cp: int | None = None,
    max_ep: int | None = None,
) -> PlanOutcome:
    """Search every layout of the request and rank those that fit (``top`` fastest); ``recompute`` limits the
    recompute modes (None: all)."""
    from gpufleet.perf.flops import RECOMPUTE_MODES
    from gpufleet.perf.planner import plan_layouts

    model = req.model_spec()
    cluster = req.cluster_spec()
    if cluster is not None and not req.pool and len({p.nic for p in cluster.training_pools}) > 1:
        return _plan_hetero(req, model, cluster, top)
    system = req.system(cluster)
    if gpus is None:
        raise ConfigError("--gpus is required: the number of GPUs to plan for (e.g. --gpus 1024)")
    if gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {gpus}")
    gbs = req.global_batch(model.seq)
    if top < 1:
        raise ConfigError(f"--top must be at least 1, got {top}")
    chosen = [_value(r) for r in (recompute or ())]
    modes = tuple(r for r in RECOMPUTE_MODES if r in chosen) if chosen else RECOMPUTE_MODES
    if max_tp is not None and max_tp < 1:
        raise ConfigError(f"--max-tp must be at least 1, got {max_tp}")
    options = req.options()
    res = plan_layouts(
        model,
        system,
        gpus,
        gbs,
        options=options,
        efficiency=req.efficiency_constants(),
        top=top,
        recompute=modes,
        max_tp=max_tp,
        max_cp=max_cp,
        max_ep=max_ep,
    )
    return PlanOutcome(model=model, gbs=gbs, options=options, result=res, system=system, gpus=gpus)


def _plan_hetero(req: PerfRequest, model: ModelSpec, cluster: ClusterSpec, top: int) -> PlanOutcome:
    """Heterogeneous planning over training pools with different NICs (``gpufleet.perf.hetero``)."""
    try:
        from gpufleet.perf.hetero import plan_hetero
    except ModuleNotFoundError as exc:
        if exc.name != "gpufleet.perf.hetero":  # a dependency of an existing module is missing: a real bug
            raise
        raise ConfigError(
            "heterogeneous planning unavailable: the training pools of this cluster use different NICs "
            f"({', '.join(sorted({p.nic for p in cluster.training_pools}))}); pass --pool to plan on one pool"
        ) from None
    gbs = req.global_batch(model.seq)
    options = req.options()
    result = plan_hetero(model, cluster, gbs, model.seq, options, req.efficiency_constants(), int(top or 10))
    return PlanOutcome(model=model, gbs=gbs, options=options, hetero=result, cluster=cluster)


def catalog_rows() -> list[dict[str, Any]]:
    """The shipped model catalog, one dict per model: shape, parameters in billions and aliases."""
    from gpufleet.perf.flops import active_params, param_count
    from gpufleet.perf.model_spec import model_catalog

    return [
        {
            "name": m.name,
            "layers": m.layers,
            "hidden": m.hidden,
            "heads": m.heads,
            "kv_heads": m.kv_heads_eff,
            "ffn": m.ffn,
            "glu": m.glu,
            "vocab": m.vocab,
            "seq": m.seq,
            "params_b": param_count(m) / 1e9,
            "active_params_b": active_params(m) / 1e9,
            "experts": f"{m.experts} top-{m.top_k}" + (f" +{m.shared_experts}" if m.shared_experts else "")
            if m.is_moe
            else "",
            "aliases": list(m.aliases),
        }
        for m in model_catalog().specs.values()
    ]
