"""The result frames of a run, built in one place for every engine feature (see ``gpufleet.sim.result``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from gpufleet.sim.workload import Workload


def job_frame(
    workload: Workload,
    first_start: Sequence[float],
    finish: Sequence[float],
    held_s: np.ndarray,
    preemptions: Sequence[int],
    extra: Mapping[str, Any] | None = None,
) -> pl.DataFrame:
    """One row per job: ``JOB_RESULT_COLUMNS``, then any feature's ``extra`` integer columns."""
    fin = np.asarray(finish, dtype=np.float64)
    jct = fin - workload.submit
    cols: dict[str, Any] = {
        "job_id": workload.job_id,
        "vc": workload.vc,
        "num_gpus": workload.gpus,
        "submit_s": workload.submit,
        "duration_s": workload.duration,
        "start_s": np.asarray(first_start, dtype=np.float64),
        "finish_s": fin,
        "jct_s": jct,
        "queue_s": jct - held_s,
        "preemptions": np.asarray(preemptions, dtype=np.int64),
    }
    for name, values in (extra or {}).items():
        cols[name] = np.asarray(values, dtype=np.int64)
    return pl.DataFrame(cols, schema_overrides={"vc": pl.Utf8, "job_id": pl.Utf8})


def timeline_frame(time_s: np.ndarray, counts: Mapping[str, np.ndarray]) -> pl.DataFrame:
    """One row per change of cluster state: ``time_s`` then integer columns (``TIMELINE_COLUMNS`` first)."""
    cols: dict[str, Any] = {"time_s": np.asarray(time_s, dtype=np.float64)}
    for name, values in counts.items():
        cols[name] = np.asarray(values).astype(np.int64, copy=False)
    return pl.DataFrame(cols)
