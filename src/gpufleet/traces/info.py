"""Summary statistics of a loaded trace: size, span, GPU demand, durations, offered load.

The numbers an operator checks before simulating a trace: is it the trace I think it is, and how
hard would it load my cluster?
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import polars as pl

from gpufleet.errors import TraceError
from gpufleet.traces.load import TraceLoad

#: Duration percentiles reported by :func:`trace_info`.
PERCENTILES = (50, 90, 99)


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def trace_info(load: TraceLoad) -> dict[str, Any]:
    """Describe a trace as a plain dict (JSON-friendly apart from int keys of the histograms).

    ``avg_busy_gpus`` is the offered load: total GPU-seconds divided by the submit span, i.e. the
    average number of busy GPUs if every job started on arrival.
    """
    jobs = load.jobs
    n = jobs.height
    info: dict[str, Any] = {
        "source": load.source,
        "reader": load.reader,
        "rows_read": load.rows_read,
        "jobs": n,
        "rejected": dict(load.rejected),
        "rejected_total": load.rejected_total,
        "vc_filter": load.vc,
        "rows_other_vcs": load.rows_other_vcs,
        "origin": _iso(load.origin),
    }
    if n == 0:
        info.update(first_submit_s=None, last_submit_s=None, span_s=0.0, span_days=0.0)
        return info
    first = float(jobs["submit_s"].min())  # type: ignore[arg-type]
    last = float(jobs["submit_s"].max())  # type: ignore[arg-type]
    span = last - first
    gpu_seconds = jobs.select((pl.col("duration_s") * pl.col("num_gpus")).sum()).item()
    by_gpus = (
        jobs.group_by("num_gpus")
        .agg(pl.len().alias("jobs"), (pl.col("duration_s") * pl.col("num_gpus")).sum().alias("gpu_s"))
        .sort("num_gpus")
    )
    by_vc = jobs.group_by("vc").len().sort(["len", "vc"], descending=[True, False], nulls_last=True)
    durations = jobs["duration_s"]
    info.update(
        first_submit_s=first,
        last_submit_s=last,
        first_submit=_iso(load.origin + timedelta(seconds=first)) if load.origin else None,
        last_submit=_iso(load.origin + timedelta(seconds=last)) if load.origin else None,
        span_s=span,
        span_days=span / 86400.0,
        jobs_per_hour=(n / (span / 3600.0)) if span > 0 else None,
        jobs_by_gpus={int(g): int(c) for g, c in zip(by_gpus["num_gpus"], by_gpus["jobs"], strict=True)},
        gpu_time_share_by_gpus={
            int(g): float(s) / gpu_seconds for g, s in zip(by_gpus["num_gpus"], by_gpus["gpu_s"], strict=True)
        },
        mean_gpus=float(jobs["num_gpus"].mean()),  # type: ignore[arg-type]
        duration_s={
            **{f"p{q}": float(durations.quantile(q / 100, "linear")) for q in PERCENTILES},  # type: ignore[arg-type]
            "mean": float(durations.mean()),  # type: ignore[arg-type]
            "max": float(durations.max()),  # type: ignore[arg-type]
        },
        gpu_hours=gpu_seconds / 3600.0,
        avg_busy_gpus=(gpu_seconds / span) if span > 0 else None,
        jobs_by_vc={v: int(c) for v, c in zip(by_vc["vc"], by_vc["len"], strict=True)},
        jobs_by_kind=dict(jobs.group_by("kind").len().sort("kind").iter_rows()),
    )
    return info


def gpus_for_load(jobs: pl.DataFrame, load: float = 0.9, gpus_per_node: int = 1) -> int:
    """GPUs on which the trace offers ``load`` of the cluster's GPU-time over its arrival window.

    Total GPU-seconds over the first-to-last submit span, divided by ``load``, rounded up to whole nodes of
    ``gpus_per_node`` and never below the largest job. Near 1 queues form and still drain; above 1 the cluster is
    overloaded and the queue grows. The learned-placement bench sizes every trace this way at 0.9.
    """
    if not load > 0:
        raise TraceError(f"load {load!r}: the share of the cluster's GPU-time the trace offers must be above 0")
    if jobs.height == 0:
        raise TraceError("the trace has no jobs: nothing to size a cluster for")
    if gpus_per_node < 1:
        raise TraceError(f"gpus_per_node must be at least 1, got {gpus_per_node!r}")
    work = float((jobs["duration_s"] * jobs["num_gpus"]).sum())
    span = max(float(jobs["submit_s"].max() - jobs["submit_s"].min()), 1.0)  # type: ignore[operator]
    need = max(work / span / load, float(jobs["num_gpus"].max()))  # type: ignore[arg-type]
    return int(math.ceil(need / gpus_per_node) * gpus_per_node)
