"""Map real traces' model names onto DeepShare's six communication profiles, with a volume scale.

The contention model (:mod:`gpufleet.perf.contention`) knows six measured workloads, each a distinct
communication pattern. A job in a real trace that names its model ("llama2-7b", "resnet50") takes the
profile whose pattern matches its own:

- dense data-parallel CNN / vision (ResNet, VGG, EfficientNet, ViT, ...) -> ``MobileNetV3`` (DDP all-reduce);
- graph neural networks (GraphSAGE, GCN, GAT, ...) -> ``GraphSage`` (DDP all-reduce of a small model);
- sharded data parallelism (FSDP, ZeRO, DeepSpeed) -> ``FSDP`` (all-gather + reduce-scatter every step);
- dense transformers / LLMs (GPT, BERT, Llama, T5, ...) -> ``Transformer-XL`` (DDP all-reduce, large model);
- recommendation models (DLRM, DeepFM, wide & deep, embeddings) -> ``DLRM`` (embedding all-to-all);
- mixture of experts (MoE, Switch, Mixtral, GShard) -> ``MoE`` (expert all-to-all).

Rules are checked in that order of precedence: MoE, sharded, recommendation, GNN, vision, transformer
(so "llama2-7b-fsdp" is FSDP and "switch-transformer" is MoE). A name in gpufleet's model catalog that no
rule matches is a transformer (the catalog holds decoder transformers only).

Volume scale. A profile was measured on one model size; a job of another size moves more or fewer bytes.
``scale = clip(sqrt(params / reference_params), 0.25, 4)``. Why the square root (an assumption, not a
measurement): gradient / parameter traffic per step grows linearly with parameters, but so does compute per
step, so the *share* of the step spent communicating, which is what contention acts on, grows more slowly
than the byte count; the square root splits the difference between "bytes only" (linear) and "compute
hides it all" (constant), and the clip keeps names far from the measured sizes from producing extreme
slowdowns. Parameters come from the model catalog (``gpufleet/data/models.toml``) when the name is there,
else from a size in the name ("7b", "350m", "1.3B", "8x7b"), else the scale is 1.0.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping

import numpy as np
import polars as pl

from gpufleet.errors import ConfigError, TraceError
from gpufleet.perf.contention import DEEPSHARE_MODELS

__all__ = [
    "REFERENCE_PARAMS",
    "SCALE_MAX",
    "SCALE_MIN",
    "assign_profiles",
    "comm_scale",
    "model_params",
    "params_from_name",
    "parse_mix",
    "profile_for_model",
    "profile_name",
    "with_comm_profiles",
]

#: Parameters of the model each DeepShare workload trained (``gajagajago/deepshare`` @ a704439,
#: ``slurm_examples/``), counted from the configs they ran:
REFERENCE_PARAMS: dict[str, float] = {
    # timm ``mobilenetv3_small_075`` (job_launch_scripts/*/timm_*.sh): 2.0M, Howard et al. 2019 (arXiv
    # 1905.02244) Table 3, MobileNetV3-Small 0.75. (MobileNetV3-Large 1.0 would be 5.4M.)
    "MobileNetV3": 2.0e6,
    # graphsage_ddp.py: SAGE(602 -> 256 -> 41) on Reddit, two SAGEConv layers (two weight matrices each):
    # 602 x 256 x 2 + 256 + 256 x 41 x 2 + 41 = 329,513.
    "GraphSage": 3.3e5,
    # fsdp.py: fairscale benchmarks' TransformerLM, FSDP golden config (benchmarks/golden_configs/
    # lm_wikitext2.py): 10 layers, d_model 2048, FFN 2048, 32 heads -> 251.9M, plus input and output
    # embeddings over the WikiText-2 vocabulary (torchtext basic_english, ~28.8k words) -> ~370M.
    "FSDP": 3.7e8,
    # transformer-xl_4,2.sh: Dai et al. 2019 (arXiv 1901.02860) base WT103 shape (d_model 410, d_inner 2100,
    # 10 heads of 41; 151M with 16 layers) run with 36 layers: 109.8M adaptive embedding + 36 x 2.57M = 202M.
    "Transformer-XL": 2.0e8,
    # dlrm_4,2.sh: facebookresearch/dlrm on Criteo Kaggle, --arch-sparse-feature-size 16: 33,762,577
    # embedding rows x 16 = 540M (the MLPs add ~0.5M): embedding-dominated.
    "DLRM": 5.4e8,
    # moe.py: fairscale TransformerLM, MOE golden config (d_model 1024, FFN 4096, 32 heads) with DeepShare's
    # 10 layers and 2 experts per GPU; total parameters of the 4-GPU job (8 experts): 10 x (4.2M attention +
    # 8 x 8.4M experts) + 59M embeddings = 773M (437M on 2 GPUs, 1.44B on 8). Total, as MoE names count.
    "MoE": 7.7e8,
}
SCALE_MIN = 0.25
SCALE_MAX = 4.0

# Rules: (profile, regex over the lower-cased name). Short keywords must not sit inside a longer word
# ("gat" in "negative"); digits around them are fine ("t5", "gpt3", "zero3").
_B = r"(?<![a-z])"  # no letter before
_E = r"(?![a-z])"  # no letter after
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (profile, re.compile(pattern))
    for profile, pattern in (
        ("MoE", rf"{_B}moe|mixtral|switch|expert|gshard|{_B}glam{_E}|{_B}dbrx{_E}|\d+x\d+(\.\d+)?[bm]{_E}"),
        ("FSDP", rf"fsdp|{_B}zero(?:[-_]?[1-3])?(?![a-z]|[-_][a-z])|zero\+\+|{_B}shard|deepspeed|fairscale"),
        (
            "DLRM",
            rf"dlrm|recsys|recommend|{_B}rec{_E}|deepfm|wide[-_&]?(and[-_])?deep|{_B}dcn|{_B}ncf{_E}|"
            rf"{_B}din{_E}|{_B}dien{_E}|criteo|{_B}ctr{_E}|embedding|two[-_]?tower",
        ),
        (
            "GraphSage",
            rf"graphsage|{_B}sage{_E}|{_B}gnn|{_B}gcn|{_B}gat{_E}|{_B}gin{_E}|{_B}pyg{_E}|{_B}dgl{_E}|"
            rf"graph",
        ),
        (
            "MobileNetV3",
            rf"mobilenet|resnet|resnext|{_B}vgg|inception|efficientnet|densenet|alexnet|"
            rf"shufflenet|squeezenet|regnet|convnext|googlenet|{_B}cnn|rcnn|{_B}yolo|{_B}unet|"
            rf"{_B}vit{_E}|{_B}deit|{_B}swin|{_B}image|imagenet|{_B}detr{_E}|retinanet",
        ),
        (
            "Transformer-XL",
            rf"transformer|{_B}gpt|llama|bert|{_B}t5{_E}|{_B}llm|{_B}opt{_E}|bloom|{_B}mpt{_E}|"
            rf"falcon|mistral|qwen|gemma|megatron|{_B}palm|chinchilla|xlnet|electra|"
            rf"{_B}bart{_E}|{_B}lm{_E}|language",
        ),
    )
)
_UNITS = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
_EXPERTS = re.compile(rf"(\d+)x(\d+(?:\.\d+)?)([mbt]){_E}")
_SIZE = re.compile(rf"(?<![0-9.])(\d+(?:\.\d+)?)([mbt]){_E}")


def _canonical_profiles() -> dict[str, str]:
    """Spelling (lower case, no dashes or underscores) -> profile name."""
    return {_fold(p): p for p in DEEPSHARE_MODELS}


def _fold(name: str) -> str:
    """Lower case without dashes, underscores or spaces: how profile names are compared."""
    return re.sub(r"[-_\s]", "", str(name).strip().lower())


def profile_name(name: str | None) -> str | None:
    """The DeepShare profile whose communication pattern matches model ``name``, or None when unknown."""
    if name is None:
        return None
    text = str(name).strip().lower()
    if not text:
        return None
    exact = _canonical_profiles().get(_fold(text))
    if exact is not None:
        return exact
    for profile, pattern in _RULES:
        if pattern.search(text):
            return profile
    return "Transformer-XL" if _catalog_params(text) is not None else None


def params_from_name(name: str) -> float | None:
    """Parameters written in a model name: "7b" -> 7e9, "350M" -> 3.5e8, "8x7b" -> 5.6e10; None without one.

    The first size in the name counts; "k" is not a size unit (it usually means context length: "32k").
    """
    text = str(name).lower()
    experts = _EXPERTS.search(text)
    if experts:
        return float(experts.group(1)) * float(experts.group(2)) * _UNITS[experts.group(3)]
    size = _SIZE.search(text)
    if size:
        return float(size.group(1)) * _UNITS[size.group(2)]
    return None


def _catalog_params(name: str) -> float | None:
    """Parameters of catalog model ``name`` (any accepted spelling), or None when not in the catalog."""
    from gpufleet.perf.flops import param_count
    from gpufleet.perf.model_spec import model_catalog

    catalog = model_catalog()
    if name not in catalog:
        return None
    return float(param_count(catalog.get(name)))


def model_params(name: str) -> float | None:
    """Parameters of model ``name``: the catalog's count, else a size parsed from the name, else None."""
    found = _catalog_params(str(name).strip())
    return found if found is not None else params_from_name(name)


def comm_scale(profile: str, params: float | None) -> float:
    """Volume scale of a ``params``-parameter model on ``profile``: clip(sqrt(params / reference), 0.25, 4)."""
    if profile not in REFERENCE_PARAMS:
        raise ConfigError(f"unknown communication profile '{profile}'; known: {', '.join(DEEPSHARE_MODELS)}")
    if params is None or not math.isfinite(params) or params <= 0:
        return 1.0
    return float(min(SCALE_MAX, max(SCALE_MIN, math.sqrt(params / REFERENCE_PARAMS[profile]))))


@functools.lru_cache(maxsize=4096)
def profile_for_model(name: str | None) -> tuple[str, float] | None:
    """(DeepShare profile, volume scale) for model ``name``; None for an unknown or missing name.

    A DeepShare workload's own name maps to itself with scale 1.0. See the module docstring for the rules.
    """
    if name is None:
        return None
    own = _canonical_profiles().get(_fold(name))
    if own is not None:
        return own, 1.0
    profile = profile_name(name)
    if profile is None:
        return None
    return profile, comm_scale(profile, model_params(str(name)))


def parse_mix(text: str) -> dict[str, float]:
    """Parse ``"FSDP=0.5,MoE=0.5"`` into {profile: weight}, weights normalised to sum to 1.

    Profile names are matched case-insensitively, ignoring dashes ("transformerxl" is Transformer-XL).
    Raises ConfigError for a malformed pair, an unknown profile, a profile given twice, or weights that are
    negative, not finite or all zero.
    """
    known = _canonical_profiles()
    example = "FSDP=0.5,MoE=0.5"
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"communication mix is empty; give profile=weight pairs, e.g. '{example}'")
    weights: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(
                f"communication mix: malformed pair '{part.strip()}' in '{text}'; expected "
                f"profile=weight pairs separated by commas, e.g. '{example}'"
            )
        profile = known.get(_fold(key))
        if profile is None:
            raise ConfigError(
                f"communication mix: unknown profile '{key.strip()}'; known: {', '.join(DEEPSHARE_MODELS)}"
            )
        if profile in weights:
            raise ConfigError(f"communication mix: profile {profile} is given twice in '{text}'")
        try:
            weight = float(value)
        except ValueError:
            raise ConfigError(f"communication mix: weight '{value.strip()}' of {profile} is not a number") from None
        weights[profile] = weight
    return _normalise(weights)


def _normalise(mix: Mapping[str, float]) -> dict[str, float]:
    """Check a {profile: weight} mapping and scale it to sum to 1."""
    bad = [p for p in mix if p not in REFERENCE_PARAMS]
    if bad:
        raise ConfigError(
            f"communication mix: unknown profile(s) {', '.join(map(str, bad))}; known: {', '.join(DEEPSHARE_MODELS)}"
        )
    values = [float(v) for v in mix.values()]
    if not values or any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise ConfigError(f"communication mix weights must be finite, non-negative and not all zero, got {dict(mix)}")
    total = sum(values)
    return {p: float(v) / total for p, v in mix.items()}


def assign_profiles(jobs: pl.DataFrame, mix: Mapping[str, float] | None = None, seed: int = 0) -> pl.DataFrame:
    """Add ``comm_profile`` (String) and ``comm_scale`` (Float64) to a job frame, replacing any already there.

    A job whose ``model`` names a known model gets :func:`profile_for_model`'s answer; any other job (no
    ``model`` column, a null or an unknown name) draws a profile from ``mix`` ({profile: weight}, default
    equal weights over DeepShare's six) with scale 1.0. Draws use ``np.random.default_rng(seed)`` with one
    uniform per row, so a row's draw depends on the seed and its position only. Jobs with ``num_gpus <= 1``
    never cross a node: null profile and scale 0.
    """
    if "num_gpus" not in jobs.columns:
        raise TraceError("assign_profiles: the jobs frame has no num_gpus column; pass a canonical trace")
    weights = _normalise(mix if mix is not None else dict.fromkeys(DEEPSHARE_MODELS, 1.0))
    n = jobs.height
    profiles = list(weights)
    cdf = np.cumsum([weights[p] for p in profiles])
    pick = np.minimum(
        np.searchsorted(cdf / cdf[-1], np.random.default_rng(seed).random(n), side="right"), len(profiles) - 1
    )
    drawn = pl.Series(np.array(profiles, dtype=object)[pick].tolist(), dtype=pl.String)
    if "model" in jobs.columns:
        names = jobs["model"].cast(pl.String)
        found = {name: profile_for_model(name) for name in names.drop_nulls().unique().to_list()}
        known = {k: v for k, v in found.items() if v is not None}
        keys = list(known)
        profile = names.replace_strict(keys, [known[k][0] for k in keys], default=None, return_dtype=pl.String)
        scale = names.replace_strict(keys, [known[k][1] for k in keys], default=None, return_dtype=pl.Float64)
    else:
        profile = pl.Series([None] * n, dtype=pl.String)
        scale = pl.Series([None] * n, dtype=pl.Float64)
    multi = jobs["num_gpus"].cast(pl.Float64).fill_null(0.0) > 1
    frame = pl.DataFrame({"p": profile, "s": scale, "d": drawn, "multi": multi})
    out = frame.select(
        pl.when(pl.col("multi")).then(pl.col("p").fill_null(pl.col("d"))).alias("comm_profile"),
        pl.when(pl.col("multi")).then(pl.col("s").fill_null(1.0)).otherwise(0.0).alias("comm_scale"),
    )
    return jobs.drop([c for c in ("comm_profile", "comm_scale") if c in jobs.columns]).with_columns(
        out["comm_profile"], out["comm_scale"]
    )


def with_comm_profiles(jobs: pl.DataFrame, comm_mix: str | None) -> pl.DataFrame:
    """The jobs ready for the network model: unchanged when every job already has a profile (a ``comm_profile``
    column, or a ``model`` column naming only DeepShare's models) and no mix is given; else :func:`assign_profiles`
    with the mix text (``"FSDP=0.5,MoE=0.5"``, None for equal shares), seed 0."""
    if "comm_profile" in jobs.columns and comm_mix is None:
        return jobs
    if (
        "model" in jobs.columns
        and comm_mix is None
        and set(jobs["model"].drop_nulls().unique()) <= set(DEEPSHARE_MODELS)
        and jobs["model"].null_count() == 0
    ):
        return jobs
    return assign_profiles(jobs, parse_mix(comm_mix) if comm_mix else None, seed=0)
