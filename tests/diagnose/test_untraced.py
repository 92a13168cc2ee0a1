"""Faults whose victims wait where no event shows it (DDP's reducer on gloo), untraced host time by position, and a
slowdown spread over many small ops: hand-built traces with a known answer."""

from __future__ import annotations

import polars as pl
import pytest
from trace_builder import Fault, JobShape, write_job

from gpufleet.diagnose.analyzer import TraceAnalyzer
from gpufleet.diagnose.summary import STEP_END, STEP_START, UNTRACED

#: fault -> (category, function of the top alarm, or None for any)
CASES = {
    "data": (Fault("data", 1, 0.02), "data_loading", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"),
    "before": (Fault("pause", 2, 0.02), "data_loading", STEP_START),  # every step, before the loader
    "after": (Fault("after", 3, 0.02), "cpu_stall", STEP_END),
    "compute": (Fault("compute", 0, 0.02), "compute", "aten::mm"),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", sorted(CASES))
def test_straggler_found_when_the_others_wait_untraced(tmp_path, case, seed):
    fault, category, function = CASES[case]
    shape = JobShape(faults=[fault], seed=seed, traced_wait=False)
    diagnosis = TraceAnalyzer(write_job(tmp_path, shape)).diagnose()
    assert diagnosis.alarms, [f.headline() for f in diagnosis.findings[:3]]
    top = diagnosis.alarms[0]
    assert (top.rank, top.category, top.function) == (fault.rank, category, function)
    # the victims wait where the training thread shows no event; the collective in flight on gloo's thread meanwhile
    # makes that gap a wait
    assert top.evidence["others_slack_s_per_step"] == pytest.approx(0.02, rel=0.3)
    assert top.evidence["others_wait_s_per_step"] == pytest.approx(0.02, rel=0.3)
    assert top.evidence["own_share_of_step"] > top.evidence["others_own_share_of_step"]


@pytest.mark.parametrize("traced_wait", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_no_alarm_without_a_fault(tmp_path, seed, traced_wait):
    diagnosis = TraceAnalyzer(write_job(tmp_path, JobShape(seed=seed, traced_wait=traced_wait))).diagnose()
    assert diagnosis.alarms == []


def test_a_pause_after_the_step_is_placed_at_the_step_end_with_its_evidence(tmp_path):
    shape = JobShape(faults=[Fault("after", 1, 0.03)], noise=0.0, traced_wait=False)
    top = TraceAnalyzer(write_job(tmp_path, shape)).diagnose().alarms[0]
    assert top.evidence["position"] == "after the step's last op"
    assert top.cost_s_per_step == pytest.approx(0.03, rel=0.05)
    assert top.evidence["others_slack_s_per_step"] == pytest.approx(0.03, rel=0.1)


def test_untraced_gaps_tile_the_step_annotation_self_time(tmp_path):
    analyzer = TraceAnalyzer(write_job(tmp_path, JobShape(faults=[Fault("after", 1, 0.01)])))
    gaps = analyzer.per_step.filter(pl.col("function").str.starts_with(UNTRACED))
    total = gaps.group_by("rank", "step").agg(pl.col("time_s").sum())
    selfs = analyzer.timelines.host.filter(pl.col("name").str.starts_with("ProfilerStep#")).select(
        "rank", "step", (pl.col("self_ns") / 1e9).alias("self_s")
    )
    joined = total.join(selfs, on=["rank", "step"])
    assert joined.height == 4 * 8
    assert (joined["time_s"] - joined["self_s"]).abs().max() < 2e-6
    assert set(gaps["function"].unique()) >= {STEP_START, STEP_END}


def test_a_slowdown_spread_over_many_small_ops_alarms_as_one_compute_finding(tmp_path):
    # 24 distinct ops, each slower by 1/24 of 20 ms: under a millisecond apiece, far under the alarm threshold alone
    shape = JobShape(faults=[Fault("compute", 2, 0.02)], matmuls=24, matmul=0.001, distinct_ops=True)
    diagnosis = TraceAnalyzer(write_job(tmp_path, shape)).diagnose()
    top = diagnosis.alarms[0]
    assert (top.rank, top.category) == (2, "compute")
    assert top.cost_s_per_step == pytest.approx(0.02, rel=0.2)
    assert top.evidence["spread"]["top_function_share"] < 0.25  # no single op explains it
    assert all(f["excess_s_per_step"] < 0.2 * top.cost_s_per_step for f in top.evidence["top_functions"])
