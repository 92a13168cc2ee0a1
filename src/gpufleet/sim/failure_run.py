"""Failure studies: run policies over a trace with a fleet's failures injected, with and without a predictor.

Each chosen policy runs once with failures only (no predictor: nodes fail, jobs die and restart from their
last checkpoint) and, when alerts are given, once more with the drain policy on (flagged nodes are drained
before they fail). :func:`comparison` puts the runs side by side. See ``docs/sim_failures.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from gpufleet.sched.policy import make_scheduler
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.failures import OutagePlan, OutageSettings
from gpufleet.sim.features.base import Feature
from gpufleet.sim.features.inference import InferenceUsage, PoolGPUs
from gpufleet.sim.network import network_for_run
from gpufleet.sim.result import SimResult
from gpufleet.sim.run import label_opts
from gpufleet.sim.workload import Workload, partitions_for

#: Checkpoint interval used with failures when none is given: MegaScale-style periodic checkpoints, hourly.
DEFAULT_FAILURE_CHECKPOINT_S = 3600.0

#: Columns of :func:`comparison`, in order.
COMPARISON_COLUMNS = (
    "policy",
    "predictor",
    "failures",
    "job_interruptions",
    "lost_gpu_hours_failures",
    "drains",
    "drain_true",
    "drain_false",
    "false_alarm_gpu_hours",
    "avoided_failures",
    "avg_jct_s",
    "finished",
    "jobs",
)


@dataclass(frozen=True)
class FailureRun:
    """One policy over one trace with one outage setting: picklable, so it travels to worker processes."""

    policy: str
    jobs: pl.DataFrame
    cluster: Any  # gpufleet.spec.ClusterSpec
    failures: pl.DataFrame
    alerts: pl.DataFrame | None = None  # None: no predictor
    config: SimConfig = field(default_factory=SimConfig)
    settings: OutageSettings = field(default_factory=OutageSettings)
    policy_opts: Mapping[str, Any] = field(default_factory=dict)
    inference: Any = None  # gpufleet.traces.inference.InferenceLoad (None: no inference load)
    elastic: Any = None  # gpufleet.sim.elastic_jobs.ElasticConfig for the Aryl family (None: defaults)
    placement_opts: Mapping[str, Any] = field(default_factory=dict)  # options of the label's placement


def run_failure_one(run: FailureRun) -> SimResult:
    """Simulate one policy with the failures (and drains, when ``run.alerts`` is set) injected.

    The fleet's time origin is the trace's first submission. A predictor run's ``SimResult.policy`` is
    ``"<policy>+predictor"``; its summary keeps ``policy`` and adds ``predictor`` (True / False).
    """
    policy = make_scheduler(run.policy, run.policy_opts, run.placement_opts)
    workload = Workload.from_frame(run.jobs)
    parts = partitions_for(run.cluster)
    origin = float(workload.submit[0]) if len(workload) else 0.0
    predictor = run.alerts is not None and run.settings.drain
    plan = OutagePlan.build(run.failures, run.alerts if predictor else None, parts, origin, run.settings)
    if policy.engine == "elastic":
        from gpufleet.sim.elastic import ElasticSimulator

        sim: Any = ElasticSimulator(
            run.jobs,
            run.cluster,
            policy,  # type: ignore[arg-type]
            run.config,
            run.elastic,
            run.inference,
            outages=plan,
        )
    else:
        features: list[Feature] = []
        if run.inference is not None and run.cluster.inference_pools:
            features.append(InferenceUsage(run.inference, PoolGPUs.of(run.cluster)))
        network = network_for_run(run.cluster, parts, run.jobs, run.config)
        sim = Simulator(workload, parts, policy, run.config, plan, network=network, features=features)
    result = sim.run()
    result.policy = run.policy
    result.summary["placement"] = policy.placement
    result.summary["predictor"] = predictor
    if predictor:
        result.policy = f"{run.policy}+predictor"
    return result


def run_failure_study(
    jobs: pl.DataFrame,
    cluster: Any,
    policies: Sequence[str],
    failures: pl.DataFrame,
    alerts: pl.DataFrame | None = None,
    config: SimConfig | None = None,
    settings: OutageSettings | None = None,
    policy_opts: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    workers: int = 1,
    on_done: Callable[[SimResult], None] | None = None,
    inference: Any = None,
    elastic: Any = None,
) -> list[SimResult]:
    """Each policy without the predictor, then (if ``alerts`` is given) with it: results in that order,
    ``[p1, p1+predictor, p2, p2+predictor, ...]``. ``workers`` > 1 runs them over a process pool."""
    config = config or SimConfig()
    settings = settings or OutageSettings()
    policy_opts = policy_opts or {}
    runs: list[FailureRun] = []
    for name in policies:
        opts, plopts = label_opts(name, policy_opts)
        base = FailureRun(name, jobs, cluster, failures, None, config, settings, opts, inference, elastic, plopts)
        runs.append(base)
        if alerts is not None:
            runs.append(replace(base, alerts=alerts))
    for r in runs:  # fail fast on a bad policy before any worker starts
        make_scheduler(r.policy, r.policy_opts, r.placement_opts)
    if workers <= 1 or len(runs) == 1:
        results = []
        for r in runs:
            results.append(run_failure_one(r))
            if on_done:
                on_done(results[-1])
        return results
    return _run_pool([replace(r, config=replace(r.config, progress=False)) for r in runs], workers, on_done)


def _run_pool(runs: list[FailureRun], workers: int, on_done: Callable[[SimResult], None] | None) -> list[SimResult]:
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    out: list[SimResult | None] = [None] * len(runs)
    with ProcessPoolExecutor(
        max_workers=min(workers, len(runs), os.cpu_count() or 1), mp_context=get_context("spawn")
    ) as pool:
        futures = {pool.submit(run_failure_one, r): i for i, r in enumerate(runs)}
        for fut in as_completed(futures):
            res = out[futures[fut]] = fut.result()
            if on_done:
                on_done(res)
    return [r for r in out if r is not None]


def comparison(results: Sequence[SimResult]) -> pl.DataFrame:
    """One row per run (policy x predictor) with the failure metrics next to JCT and jobs finished."""
    rows = [{c: r.summary.get(c) for c in COMPARISON_COLUMNS} for r in results]
    return pl.DataFrame(
        rows,
        schema={
            "policy": pl.Utf8,
            "predictor": pl.Boolean,
            "failures": pl.Int64,
            "job_interruptions": pl.Int64,
            "lost_gpu_hours_failures": pl.Float64,
            "drains": pl.Int64,
            "drain_true": pl.Int64,
            "drain_false": pl.Int64,
            "false_alarm_gpu_hours": pl.Float64,
            "avoided_failures": pl.Int64,
            "avg_jct_s": pl.Float64,
            "finished": pl.Int64,
            "jobs": pl.Int64,
        },
    )
