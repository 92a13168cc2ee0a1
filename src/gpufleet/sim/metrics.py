"""The summary row of a run: JCT and queueing statistics, utilisation, makespan, preemptions.

Both engines build their summary here, so a metric added to :func:`summarize` reaches every run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl


def time_weighted_mean(time_s: np.ndarray, value: np.ndarray, start: float, end: float) -> float:
    """Mean of a step function (``value[i]`` holds from ``time_s[i]`` to ``time_s[i+1]``) over [start, end]."""
    if end <= start or len(time_s) == 0:
        return 0.0
    t = np.clip(np.append(time_s, end), start, end)
    return float(np.sum(value * np.diff(t)) / (end - start))


def util_window(jobs: pl.DataFrame, timeline: pl.DataFrame, total_gpus: int) -> float:
    """GPU utilisation between the first and the last submission: time-weighted busy GPUs / ``total_gpus``.

    Unlike ``gpu_util`` (to the last finish) it does not fall with a long drain after the last arrival, so
    it shows whether the arrivals kept the cluster loaded. 0 when the submissions span no time.
    """
    if not total_gpus or jobs.height == 0 or timeline.height == 0:
        return 0.0
    first, last = float(jobs["submit_s"].min()), float(jobs["submit_s"].max())
    t, busy = timeline["time_s"].to_numpy(), timeline["busy_gpus"].to_numpy()
    return time_weighted_mean(t, busy, first, last) / total_gpus


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


def summarize(
    policy: str, jobs: pl.DataFrame, timeline: pl.DataFrame, total_gpus: int, wall_s: float, meta: dict[str, Any]
) -> dict[str, Any]:
    """One row per run; keys are the ``--json`` contract (seconds, fractions in [0, 1])."""
    done = jobs.filter(pl.col("finish_s").is_not_nan())
    jct = done["jct_s"].to_numpy()
    queue = done["queue_s"].to_numpy()
    first = float(jobs["submit_s"].min()) if jobs.height else 0.0
    last = float(done["finish_s"].max()) if done.height else first
    makespan = last - first
    util = (
        time_weighted_mean(timeline["time_s"].to_numpy(), timeline["busy_gpus"].to_numpy(), first, last) / total_gpus
        if total_gpus
        else 0.0
    )
    return {
        "policy": policy,
        "jobs": jobs.height,
        "finished": done.height,
        "avg_jct_s": float(jct.mean()) if len(jct) else float("nan"),
        "median_jct_s": _pct(jct, 50),
        "p95_jct_s": _pct(jct, 95),
        "p99_jct_s": _pct(jct, 99),
        "avg_queue_s": float(queue.mean()) if len(queue) else float("nan"),
        "median_queue_s": _pct(queue, 50),
        "p95_queue_s": _pct(queue, 95),
        "p99_queue_s": _pct(queue, 99),
        "gpu_util": util,
        "util_window": util_window(jobs, timeline, total_gpus),
        "makespan_s": makespan,
        "preemptions": int(jobs["preemptions"].sum()),
        "lost_work_gpu_h": float(meta.get("lost_work_gpu_s", 0.0)) / 3600.0,
        "unschedulable": int(sum(meta.get("unschedulable", {}).values())),
        "events": int(meta.get("events", 0)),
        "wall_s": wall_s,
    }
