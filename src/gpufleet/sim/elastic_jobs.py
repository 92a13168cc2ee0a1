"""Which jobs of a trace are elastic, and how far: workers of ``g`` GPUs between a base and a maximum count.

A trace may say so itself (columns ``min_workers``, ``max_workers`` and optionally ``gpus_per_worker``);
otherwise a share of the jobs is made elastic by a hash of the job id, so the choice is the same for every
policy and every run. A job of ``n`` GPUs has workers of ``g = min(n, gpus_per_node)`` GPUs (a worker is
one replica on one server) and a base demand of ``n / g`` workers; an elastic job may grow to
``max_scale`` times that, capped at ``max_gpus`` GPUs but never below its base.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import polars as pl

from gpufleet.errors import ConfigError, TraceError


@dataclass(frozen=True)
class ElasticConfig:
    """How trace jobs become elastic, and what scaling costs.

    ``elastic_share``: fraction of jobs made elastic when the trace has no ``min_workers`` column. No source
    states the share in Aryl's trace; 0.5 is the middle of the 0-100 % sweep the research notes recommend
    (``bench/aryl_eval.py`` sweeps it). ``scale_pause_s``: seconds a job makes no progress after a scale
    event; 40 s is the mean of the six per-model restart delays DeepBoot measured (18-103 s).
    ``loan_speed``: throughput of a worker on a loaned inference server relative to a training server
    (None: from the GPU catalog, see :func:`loan_speed_from_catalog`).
    """

    elastic_share: float = 0.5
    max_scale: float = 4.0
    max_gpus: int = 64
    scale_pause_s: float = 40.0
    loan_speed: float | None = None
    reclaim_notice_s: float = 0.0
    interval_s: float = 300.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.elastic_share <= 1.0:
            raise ConfigError(f"elastic share must be in [0, 1], got {self.elastic_share}")
        if self.max_scale < 1.0:
            raise ConfigError(f"max_scale must be >= 1, got {self.max_scale}")
        if self.scale_pause_s < 0 or self.reclaim_notice_s < 0:
            raise ConfigError("scale_pause_s and reclaim_notice_s must be >= 0")
        if self.interval_s <= 0:
            raise ConfigError(f"interval_s must be > 0, got {self.interval_s}")
        if self.loan_speed is not None and not 0.0 < self.loan_speed <= 4.0:
            raise ConfigError(f"loan_speed must be in (0, 4], got {self.loan_speed}")


@dataclass(frozen=True)
class ElasticJobs:
    """Per job (in submit order): GPUs per worker, base and maximum workers."""

    gpus_per_worker: np.ndarray
    min_workers: np.ndarray
    max_workers: np.ndarray

    @property
    def elastic(self) -> np.ndarray:
        """True where a job may run with more workers than its base demand."""
        return self.max_workers > self.min_workers


def _hash_unit(job_ids: list[str], seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per job id, stable across runs and machines."""
    out = np.empty(len(job_ids))
    for i, jid in enumerate(job_ids):
        h = hashlib.blake2b(f"{seed}:{jid}".encode(), digest_size=8).digest()
        out[i] = int.from_bytes(h, "little") / 2**64
    return out


def assign_elastic(
    jobs: pl.DataFrame, config: ElasticConfig, gpus_per_node: int, elastic_override: bool | None = None
) -> ElasticJobs:
    """Workers per job for the frame ``jobs`` (already in submit order).

    ``elastic_override`` False makes every job inelastic (policies without elastic scaling).
    """
    n = jobs["num_gpus"].cast(pl.Int64).to_numpy()
    if "min_workers" in jobs.columns:
        return _from_columns(jobs, n, elastic_override)
    g = np.minimum(n, gpus_per_node)
    base = -(-n // g)
    if elastic_override is False or config.elastic_share == 0.0:
        return ElasticJobs(g, base, base.copy())
    pick = _hash_unit(jobs["job_id"].cast(pl.Utf8).to_list(), config.seed) < config.elastic_share
    top = np.maximum(base, np.minimum(np.floor(base * config.max_scale), config.max_gpus // g)).astype(np.int64)
    return ElasticJobs(g, base, np.where(pick, top, base))


def _from_columns(jobs: pl.DataFrame, n: np.ndarray, elastic_override: bool | None) -> ElasticJobs:
    if "max_workers" not in jobs.columns:
        raise TraceError("the trace has a min_workers column but no max_workers column; give both")
    lo = jobs["min_workers"].cast(pl.Int64).to_numpy()
    hi = jobs["max_workers"].cast(pl.Int64).to_numpy()
    if "gpus_per_worker" in jobs.columns:
        g = jobs["gpus_per_worker"].cast(pl.Int64).to_numpy()
    else:
        g = np.maximum(n // np.maximum(lo, 1), 1)
    bad = np.flatnonzero((lo < 1) | (hi < lo) | (g < 1))
    if bad.size:
        i = int(bad[0])
        raise TraceError(
            f"job {jobs['job_id'][i]}: needs 1 <= min_workers <= max_workers and gpus_per_worker >= 1 "
            f"(got {lo[i]}, {hi[i]}, {g[i]}); {bad.size} job(s) are affected"
        )
    if elastic_override is False:
        hi = lo.copy()
    return ElasticJobs(g, lo, hi)


def loan_speed_from_catalog(training_gpu: str, inference_gpu: str) -> float:
    """A worker's speed on ``inference_gpu`` over ``training_gpu``: the geometric mean of the dense fp16
    tensor-throughput ratio and the memory-bandwidth ratio (training steps are bound by both; a T4 is
    about 0.43 of a V100 this way)."""
    from gpufleet.spec.catalog import get_gpu

    a, b = get_gpu(training_gpu), get_gpu(inference_gpu)
    ratio = (b.dense_fp16_tflops / a.dense_fp16_tflops) * (b.memory_bw_gbps / a.memory_bw_gbps)
    return float(min(4.0, ratio**0.5))
