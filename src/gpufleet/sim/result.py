"""The outcome of one simulation run: per-job records, a cluster timeline and a summary row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

#: Columns of ``SimResult.jobs`` (one row per job of the trace that the run saw).
JOB_RESULT_COLUMNS = (
    "job_id",  # str
    "vc",  # str | None
    "num_gpus",  # int
    "submit_s",  # float, seconds since trace start
    "duration_s",  # float, work the job needed (its run time at full speed)
    "start_s",  # float | NaN, first time the job started running (NaN if it never started)
    "finish_s",  # float | NaN, completion time (NaN if unfinished when the run ended)
    "jct_s",  # float | NaN, finish_s - submit_s
    "queue_s",  # float | NaN, time spent waiting (not holding GPUs) between submit and finish
    "preemptions",  # int, how often the job was preempted
)

#: Columns of ``SimResult.timeline``: one row per change of cluster state.
TIMELINE_COLUMNS = (
    "time_s",  # float, event time
    "busy_gpus",  # int, GPUs held by running jobs after the event
    "queued_jobs",  # int, jobs waiting after the event
    "running_jobs",  # int, jobs running after the event
)

#: Extra columns of the timeline of the Aryl policies (server-level placement, ``sim.elastic``).
ELASTIC_TIMELINE_COLUMNS = (
    "loaned_servers",  # int, inference servers on loan to training
    "loaned_gpus_used",  # int, GPUs training holds on loaned servers
    "loaned_gpus",  # int, all GPUs of the servers on loan (what training may use there)
    "inference_gpus",  # int, GPUs of the inference pool held by inference (not on loan)
    "inference_servers_needed",  # int, servers the inference load needs now
)

#: Extra columns of the job frame of the Aryl policies.
ELASTIC_JOB_COLUMNS = (
    "scale_events",  # int, how often the job's workers changed while it ran
    "max_workers",  # int, most workers the job may have
    "min_workers",  # int, its base demand in workers
)


@dataclass
class SimResult:
    """Everything a run produced; ``summary`` is the row printed by the CLI and ``--json``."""

    policy: str
    summary: dict[str, Any]
    jobs: pl.DataFrame
    timeline: pl.DataFrame
    total_gpus: int
    meta: dict[str, Any] = field(default_factory=dict)
