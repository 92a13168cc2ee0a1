"""DeepShare-style job mixes: the six communication-heavy workloads of Ryu & Eo's testbed, by intensity.

DeepShare ("Network Contention-Aware Cluster Scheduling with Reinforcement Learning", ICPADS 2023; code
``gajagajago/deepshare``) evaluates on traces of 256 jobs whose models are drawn with a bias towards light,
medium or heavy network users. Its generator (``scheduler/scripts/generate_traces.py`` @ a704439) draws,
once per trace, a model weight vector and a GPU-demand weight vector, then each job's model and demand
independently from them:

- model weights by intensity (the ratios in the generator; all but "random" are commented-out lines there):
  light ("low") 0.25 each for MobileNetV3 and GraphSage, medium ("med") 0.25 each for Transformer-XL and
  DLRM, heavy 0.25 each for FSDP and MoE, the other four models 0.125 each; "equal" 1/6 each; "random"
  ``multinomial(100, [1/6] * 6) / 100`` (a fresh, roughly even vector per trace, in steps of 0.01);
- GPU-demand weights over {2, 4, 8}: ``multinomial(100, [1/3] * 3) / 100`` per trace, for every intensity
  (uniform in expectation, about +-0.05 per trace).

A job's duration is DeepShare's: samples to train over its isolated throughput on the fewest nodes
(:meth:`gpufleet.perf.contention.ContentionModel.duration_s`: 0.35-1 h on 8-GPU nodes). Upstream submits
every job at t = 0 ("batch"); "poisson" spreads them at a constant rate instead. All randomness comes from
``np.random.default_rng``: independent child streams of ``SeedSequence(seed)`` for the weights, the models,
the demands and the arrivals, so one seed gives one frame, and two intensities with the same seed share
their demand weights, demand draws and arrival times.

The mixes live in ``sim`` rather than ``traces`` because their durations come from ``perf``'s DeepShare model:
``sim`` is the package that may use both (DESIGN.md's layering); the frames they give are canonical job traces.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from gpufleet.errors import TraceError
from gpufleet.traces.schema import jobs_from_arrays

if TYPE_CHECKING:
    from gpufleet.perf.contention import ContentionModel

__all__ = [
    "ARRIVALS",
    "DEMANDS",
    "INTENSITIES",
    "MIX_MODELS",
    "default_rate_per_h",
    "generate_mix",
    "mean_gpu_hours",
    "mix_weights",
    "resolve_intensity",
]

#: DeepShare's six workloads in its order (``scheduler/rl_training/config.py`` MODELS). The same tuple as
#: ``gpufleet.perf.contention.DEEPSHARE_MODELS`` (a test checks it), kept here so that importing this module
#: loads ``perf`` only when a duration is computed.
MIX_MODELS = ("MobileNetV3", "GraphSage", "FSDP", "Transformer-XL", "DLRM", "MoE")
#: GPU demands of DeepShare's job types.
DEMANDS = (2, 4, 8)
INTENSITIES = ("light", "medium", "heavy", "equal", "random")
_ALIASES = {"low": "light", "med": "medium", "high": "heavy"}
ARRIVALS = ("batch", "poisson")
#: Model weights per intensity (upstream's commented ratios, MIX_MODELS order); "random" is drawn per trace.
_FIXED_WEIGHTS: dict[str, tuple[float, ...]] = {
    "light": (0.25, 0.25, 0.125, 0.125, 0.125, 0.125),
    "medium": (0.125, 0.125, 0.125, 0.25, 0.25, 0.125),
    "heavy": (0.125, 0.125, 0.25, 0.125, 0.125, 0.25),
    "equal": (1 / 6,) * 6,
}
#: Trials of upstream's multinomial weight draws (weights come in steps of 1 / 100).
_TRIALS = 100
#: The cluster the default Poisson rate is sized for: DeepShare's testbed, 4 nodes x 8 GPUs.
DEFAULT_CLUSTER_GPUS = 32
_HOUR = 3600.0


def resolve_intensity(intensity: str) -> str:
    """The canonical intensity name for ``intensity`` (aliases low, med, high; case-insensitive)."""
    if not isinstance(intensity, str):
        raise TraceError(f"intensity must be a string, got {intensity!r}")
    key = intensity.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in INTENSITIES:
        raise TraceError(
            f"unknown intensity '{intensity}'; use one of: {', '.join(INTENSITIES)} (aliases: low, med, high)"
        )
    return key


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise TraceError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _streams(seed: int) -> list[np.random.Generator]:
    """Independent generators for: model weights, demand weights, model draws, demand draws, arrivals."""
    children = np.random.SeedSequence(_check_seed(seed)).spawn(5)
    return [np.random.default_rng(child) for child in children]


def _weights(intensity: str, rngs: list[np.random.Generator]) -> tuple[np.ndarray, np.ndarray]:
    key = resolve_intensity(intensity)
    if key == "random":
        models = rngs[0].multinomial(_TRIALS, [1 / len(MIX_MODELS)] * len(MIX_MODELS)) / _TRIALS
    else:
        models = np.array(_FIXED_WEIGHTS[key])
    demands = rngs[1].multinomial(_TRIALS, [1 / len(DEMANDS)] * len(DEMANDS)) / _TRIALS
    return models.astype(np.float64), demands.astype(np.float64)


def mix_weights(intensity: str = "heavy", seed: int = 0) -> tuple[dict[str, float], dict[int, float]]:
    """The per-trace weights ``generate_mix`` draws from: ({model: weight}, {gpus: weight}), each summing to 1."""
    models, demands = _weights(intensity, _streams(seed))
    return (dict(zip(MIX_MODELS, models.tolist(), strict=True)), dict(zip(DEMANDS, demands.tolist(), strict=True)))


def _check_gpus_per_node(gpus_per_node: int) -> int:
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int | np.integer) or gpus_per_node < 1:
        raise TraceError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")
    return int(gpus_per_node)


def _durations(model: ContentionModel | None, gpus_per_node: int) -> np.ndarray:
    """Seconds of each (model, demand) job alone on the fewest nodes, shape (6, 3)."""
    if model is None:
        from gpufleet.perf.contention import ContentionModel

        model = ContentionModel.default()
    return np.array([[model.duration_s(name, g, gpus_per_node) for g in DEMANDS] for name in MIX_MODELS])


def mean_gpu_hours(
    intensity: str = "heavy", seed: int = 0, gpus_per_node: int = 8, model: ContentionModel | None = None
) -> float:
    """Expected GPU-hours of one job of the trace ``(intensity, seed)``: sum of w_m x w_g x g x duration.

    Model and demand are drawn independently, so this is the exact mean of the distribution the trace's
    jobs come from (not of the sampled jobs). About 3.2-3.4 GPU-h for "equal" on 8-GPU nodes.
    """
    models, demands = _weights(intensity, _streams(seed))
    return _gpu_hours(models, demands, _durations(model, _check_gpus_per_node(gpus_per_node)))


def _gpu_hours(model_w: np.ndarray, demand_w: np.ndarray, table: np.ndarray) -> float:
    """Mean GPU-hours per job for weights and a (model, demand) duration table."""
    return float(model_w @ (table * np.array(DEMANDS)) @ demand_w) / _HOUR


def default_rate_per_h(
    intensity: str = "heavy",
    seed: int = 0,
    gpus_per_node: int = 8,
    model: ContentionModel | None = None,
    cluster_gpus: int = DEFAULT_CLUSTER_GPUS,
    load: float = 1.0,
) -> float:
    """Poisson rate (jobs/h) that offers ``load`` of ``cluster_gpus`` GPUs: load x GPUs / mean GPU-hours per job.

    By Little's law the GPUs the jobs ask for, averaged over time, are rate x E[gpus x duration]; the
    default (1.0 x DeepShare's 32 GPUs) is about 10 jobs/h for an even mix. Offered load ignores
    contention and placement, so the cluster is saturated at this rate.
    """
    if not (math.isfinite(load) and load > 0) or not (math.isfinite(cluster_gpus) and cluster_gpus > 0):
        raise TraceError(f"load and cluster_gpus must be positive numbers, got {load} and {cluster_gpus}")
    return load * cluster_gpus / mean_gpu_hours(intensity, seed, gpus_per_node, model)


def _choose(rng: np.random.Generator, weights: np.ndarray, n: int) -> np.ndarray:
    """Indices drawn with ``weights`` by inverse CDF (one uniform per job: coupled across weight vectors)."""
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), weights.size - 1)


def generate_mix(
    intensity: str = "heavy",
    jobs: int = 256,
    seed: int = 0,
    arrival: str = "batch",
    rate_per_h: float | None = None,
    gpus_per_node: int = 8,
    model: ContentionModel | None = None,
) -> pl.DataFrame:
    """A DeepShare-style trace of ``jobs`` jobs as a canonical job frame plus a String column ``model``.

    ``intensity``: light (low), medium (med), heavy, equal or random (see the module docstring for the
    weights). ``arrival``: "batch" (every job at t = 0, as upstream) or "poisson" at ``rate_per_h`` jobs per
    hour (default :func:`default_rate_per_h`: offered load 1.0 on a 32-GPU cluster). ``duration_s`` is
    ``model.duration_s(name, gpus, gpus_per_node)``, ``model`` defaulting to the shipped
    ``ContentionModel.default()``. Raises TraceError for bad arguments.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int | np.integer) or jobs < 0:
        raise TraceError(f"jobs must be a non-negative integer, got {jobs!r}")
    if arrival not in ARRIVALS:
        raise TraceError(f"unknown arrival '{arrival}'; use one of: {', '.join(ARRIVALS)}")
    if rate_per_h is not None:
        if arrival != "poisson":
            raise TraceError("rate_per_h applies to arrival='poisson' only; batch jobs all arrive at t = 0")
        if isinstance(rate_per_h, bool) or not _positive(rate_per_h):
            raise TraceError(f"rate_per_h must be a positive number of jobs per hour, got {rate_per_h!r}")
    gpn = _check_gpus_per_node(gpus_per_node)
    rngs = _streams(seed)
    model_w, demand_w = _weights(intensity, rngs)
    table = _durations(model, gpn)
    n = int(jobs)
    mi = _choose(rngs[2], model_w, n)
    gi = _choose(rngs[3], demand_w, n)
    if arrival == "poisson":
        rate = (
            float(rate_per_h) if rate_per_h is not None else DEFAULT_CLUSTER_GPUS / _gpu_hours(model_w, demand_w, table)
        )
        submit = np.cumsum(rngs[4].exponential(_HOUR / rate, n))
    else:
        submit = np.zeros(n)
    models = pl.Series(np.array(MIX_MODELS, dtype=object)[mi].tolist(), dtype=pl.String)
    return jobs_from_arrays(
        submit.astype(np.float64),
        table[mi, gi].astype(np.float64),
        np.array(DEMANDS, dtype=np.int32)[gi],
        prefix="ds",
        extra={"model": models},
    )


def _positive(value: object) -> bool:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number > 0
