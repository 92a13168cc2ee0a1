"""The job trace as the simulator's arrays, and the cluster's training pools as partitions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from gpufleet.errors import TraceError
from gpufleet.sim.partition import Partition

REQUIRED = ("job_id", "submit_s", "duration_s", "num_gpus")


@dataclass
class Workload:
    """Columnar job arrays in submit order; ``gpu_type`` is None where a job runs on any GPU type."""

    job_id: list[str]
    submit: np.ndarray
    duration: np.ndarray
    gpus: np.ndarray
    gpu_type: list[str | None]
    vc: list[str | None]

    def __len__(self) -> int:
        return len(self.job_id)

    @classmethod
    def from_frame(cls, jobs: pl.DataFrame) -> Workload:
        """Build from a canonical job frame (see ``gpufleet.traces.schema``), sorted by submit time."""
        missing = [c for c in REQUIRED if c not in jobs.columns]
        if missing:
            raise TraceError(f"job frame lacks column(s) {', '.join(missing)}; it has {', '.join(jobs.columns)}")
        jobs = jobs.sort("submit_s", maintain_order=True)
        n = jobs.height
        none: list[str | None] = [None] * n
        return cls(
            job_id=jobs["job_id"].cast(pl.Utf8).to_list(),
            submit=jobs["submit_s"].cast(pl.Float64).to_numpy(),
            duration=jobs["duration_s"].cast(pl.Float64).to_numpy(),
            gpus=jobs["num_gpus"].cast(pl.Int64).to_numpy(),
            gpu_type=jobs["gpu_type"].to_list() if "gpu_type" in jobs.columns else none,
            vc=jobs["vc"].to_list() if "vc" in jobs.columns else list(none),
        )


def partitions_for(cluster: object) -> list[Partition]:
    """One partition per training pool of a ``ClusterSpec`` (inference pools are not for training jobs)."""
    parts = [
        Partition(pool.name, pool.gpu, pool.nodes, pool.gpus_per_node)
        for pool in cluster.pools  # type: ignore[attr-defined]
        if pool.kind == "training"
    ]
    if not parts:
        from gpufleet.errors import SpecError

        raise SpecError(f"cluster '{cluster.name}' has no training pool")  # type: ignore[attr-defined]
    return parts
