"""Localisers on hand-built traces whose injected fault is known, and timeline invariants on real traces."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from trace_builder import Fault, JobShape, write_job

from gpufleet.diagnose.analyzer import TraceAnalyzer
from gpufleet.diagnose.kineto import read_folder
from gpufleet.diagnose.localize import Thresholds, rank_excesses
from gpufleet.errors import DiagnoseError

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"  # HTA's test traces (MIT), see ATTRIBUTION.md

FAULTS = {
    "compute": (Fault("compute", 2, 0.02), "compute"),
    "data": (Fault("data", 1, 0.02), "data_loading"),
    "pause": (Fault("pause", 3, 0.1, every=3), "cpu_stall"),
    "comm": (Fault("comm", 0, 0.02), "communication"),
    "sync": (Fault("sync", 1, 0.006), "sync"),
    "hang": (Fault("hang", 2, every=4), "hang"),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_top_finding_names_the_injected_rank_and_category(tmp_path, kind, seed):
    fault, category = FAULTS[kind]
    diagnosis = TraceAnalyzer(write_job(tmp_path, JobShape(faults=[fault], seed=seed))).diagnose()
    top = diagnosis.findings[0]
    assert (top.rank, top.category, top.alarm) == (fault.rank, category, True), top
    assert top.cost_s_per_step > 0


@pytest.mark.parametrize("seed", range(4))
def test_no_fault_raises_no_alarm(tmp_path, seed):
    diagnosis = TraceAnalyzer(write_job(tmp_path, JobShape(seed=seed))).diagnose()
    assert diagnosis.alarms == []
    assert diagnosis.findings == [] or all(
        f.score < 3.5 or f.cost_s_per_step < 0.02 * diagnosis.step_s_median for f in diagnosis.findings
    )


def test_cost_is_the_injected_delay_and_victims_wait_for_it(tmp_path):
    diagnosis = TraceAnalyzer(write_job(tmp_path, JobShape(faults=[Fault("data", 1, 0.03)], noise=0.0))).diagnose()
    top = diagnosis.findings[0]
    assert top.cost_s_per_step == pytest.approx(0.03, rel=0.05)
    assert top.evidence["others_wait_s_per_step"] == pytest.approx(0.03, rel=0.1)
    assert top.function.startswith("enumerate(DataLoader)")


def test_pause_evidence_gives_its_period(tmp_path):
    diagnosis = TraceAnalyzer(write_job(tmp_path, JobShape(faults=[FAULTS["pause"][0]], steps=9))).diagnose()
    top = diagnosis.findings[0]
    assert top.evidence["pause_steps"] == [0, 3, 6] and top.evidence["period_steps"] == 3


def test_thresholds_decide_the_alarm(tmp_path):
    folder = write_job(tmp_path, JobShape(faults=[Fault("compute", 2, 0.004)], seed=0))
    loose = TraceAnalyzer(folder, Thresholds(cost_share=0.01)).diagnose()
    strict = TraceAnalyzer(folder, Thresholds(cost_share=0.5)).diagnose()
    assert loose.alarms and loose.alarms[0].rank == 2
    assert not strict.alarms and strict.findings[0].rank == 2


def test_unknown_localiser_is_an_error(tmp_path):
    with pytest.raises(DiagnoseError, match="unknown localiser"):
        TraceAnalyzer(write_job(tmp_path, JobShape())).diagnose(["cross-rank", "telepathy"])


def test_gloo_wait_is_split_from_own_comm_time(tmp_path):
    a = TraceAnalyzer(write_job(tmp_path, JobShape(faults=[Fault("comm", 0, 0.02)], noise=0.0)))
    section = (
        a.per_step.filter(pl.col("function") == "gpufleet::allreduce")
        .group_by("rank")
        .agg(pl.col("time_s").mean(), pl.col("wait_s").mean())
        .sort("rank")
    )
    own, wait = section["time_s"].to_list(), section["wait_s"].to_list()
    assert own[0] == pytest.approx(0.02, abs=1e-3) and max(own[1:]) < 1e-3  # the delay is rank 0's own work
    assert min(wait[1:]) - wait[0] == pytest.approx(0.02, abs=1e-3)  # the others wait for it


def test_self_times_on_the_step_thread_add_up_to_the_step():
    a = TraceAnalyzer(read_folder(KINETO / "trace_filter__sampled_rank-0.json.gz"))
    spans = a.timelines.spans
    host = a.timelines.host.join(spans.select("rank", "step", "pid", "tid"), on=["rank", "step", "pid", "tid"])
    per_step = host.group_by("step").agg(pl.col("self_ns").sum()).join(spans, on="step").sort("step")
    for row in per_step.iter_rows(named=True):
        assert row["self_ns"] == pytest.approx(row["dur_ns"], rel=0.01)


def test_real_gpu_trace_kernels_get_the_step_of_their_launch():
    a = TraceAnalyzer(read_folder(KINETO / "trace_filter__sampled_rank-0.json.gz"))
    dev = a.timelines.device
    assert dev.height > 1000 and dev["step"].null_count() < dev.height * 0.05
    nccl = dev.filter(pl.col("category") == "communication")
    assert nccl.height == 10 and (nccl["wait_ns"] == nccl["dur_ns"]).all()
    summary = a.function_summary()
    assert {"calls", "total_s", "mean_s", "p50_s", "p95_s", "cv", "share_of_step"} <= set(summary.columns)
    assert (summary["p95_s"] >= summary["p50_s"] - 1e-12).all()


def test_a_slowdown_in_a_minority_of_steps_is_not_a_slow_rank(tmp_path):
    # rank 2's matmuls are slow in 2 of 8 steps only (a process descheduled for a moment): per call site, the median
    # over steps is its steady time, so it is no slower than the others; a slowdown in every step is
    blip = TraceAnalyzer(write_job(tmp_path / "blip", JobShape(faults=[Fault("compute", 2, 0.02, every=4)]))).diagnose()
    steady = TraceAnalyzer(write_job(tmp_path / "steady", JobShape(faults=[Fault("compute", 2, 0.02)]))).diagnose()
    assert not [f for f in blip.alarms if f.category == "compute"]
    assert (steady.alarms[0].rank, steady.alarms[0].category) == (2, "compute")


def test_a_blocking_wait_in_which_the_collective_ends_is_all_waiting():
    # main thread (tid 1): a step holding the all-reduce section, which holds the rank's bucket copy and its blocking
    # wait; gloo's worker (tid 2) runs the collective from 100 to 200 us. The wait lasts until 260 us: the thread
    # took 60 us to wake up after the collective ended, which is waiting, not the rank's own communication work
    from gpufleet.diagnose.kineto import EVENT_SCHEMA
    from gpufleet.diagnose.timeline import host_timeline

    rows = [
        ("user_annotation", "ProfilerStep#0", 1, 0, 400),
        ("user_annotation", "gpufleet::allreduce", 1, 50, 300),
        ("cpu_op", "aten::cat", 1, 60, 30),
        ("user_annotation", "gpufleet::comm_wait", 1, 150, 110),
        ("cpu_op", "gloo:all_reduce", 2, 100, 100),
    ]
    frame = pl.DataFrame(
        [
            {"rank": 0, "ph": "X", "cat": c, "name": n, "pid": 7, "tid": t, "ts_ns": ts * 1000, "dur_ns": d * 1000}
            for c, n, t, ts, d in rows
        ],
    ).with_columns(pl.col("rank").cast(pl.Int32))
    missing = [k for k in EVENT_SCHEMA if k not in frame.columns]
    frame = frame.with_columns(*(pl.lit(None, dtype=EVENT_SCHEMA[k]).alias(k) for k in missing))
    host = host_timeline(frame.select(list(EVENT_SCHEMA)).cast(EVENT_SCHEMA)).sort("ts_ns")
    wait = dict(zip(host["name"], host["wait_ns"], strict=True))
    own = dict(zip(host["name"], host["self_ns"] - host["wait_ns"], strict=True))
    assert wait["gpufleet::comm_wait"] == 110_000 and own["gpufleet::comm_wait"] == 0
    # the section holds ops, so the rule does not apply to it: of its 160 us of self time (50-60, 90-150, 260-350
    # us) it waits for the part the collective in flight (100-200 us) covers outside its children (100-150 us)
    assert wait["gpufleet::allreduce"] == 50_000 and own["gpufleet::allreduce"] == 110_000


def test_rank_excesses_finds_the_slow_rank_against_the_others_median():
    values = np.array([1.0, 1.02, 0.98, 1.01, 1.6])
    hits = rank_excesses(values, floor=0.01)
    assert [h.index for h in hits] == [4]
    hit = hits[0]
    assert hit.others == pytest.approx(np.median([1.0, 1.02, 0.98, 1.01]))
    assert hit.cost == pytest.approx(1.6 - hit.others)
    assert hit.score >= 2.0


def test_rank_excesses_floor_and_fast_ranks_raise_nothing():
    spread = np.array([1.0, 1.02, 0.98, 1.01, 1.06])
    assert [h.index for h in rank_excesses(spread, floor=1e-6)] == [4]  # small spread: 1.06 stands out
    assert rank_excesses(spread, floor=0.1) == []  # a noise floor above the excess hides it
    assert rank_excesses(np.array([1.0, 1.0, 1.0, 0.2]), floor=0.01) == []  # a fast rank is no excess


def test_functions_of_equal_time_are_listed_by_name(tmp_path):
    """.item() and its child op take the same time: the evidence lists them by name, the same on every run."""
    write_job(tmp_path, JobShape(ranks=5, steps=8, seed=2, faults=[Fault("sync", 2)]))
    finding = next(f for f in TraceAnalyzer(tmp_path).diagnose().findings if f.localiser == "extra-calls")
    listed = [(-e["excess_s_per_step"], e["function"]) for e in finding.evidence["extra_functions"]]
    ties = [(a, b) for a, b in pairwise(listed) if a[0] == b[0]]
    assert ties, "the job has functions of equal time"
    assert all(a[1] < b[1] for a, b in ties)
