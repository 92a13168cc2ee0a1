"""Evidence rules beyond cost and victims: a sync judged by its steady count, a slow rank by the sign test over call
sites, a pause that fills half the steps against the quiet half, and victims in the pause steps."""

from __future__ import annotations

import polars as pl
import pytest
from trace_builder import Fault, JobShape, write_job

from gpufleet.diagnose.analyzer import TraceAnalyzer
from gpufleet.diagnose.localize import Thresholds
from gpufleet.diagnose.localizers.cross_rank import slowest_sites
from gpufleet.diagnose.victims import Slack


@pytest.mark.parametrize("seed", [0, 1])
def test_a_cheap_needless_sync_alarms_on_its_steady_count(tmp_path, seed):
    # 18 extra syncs per step costing ~0.1 % of the step: far under any cost threshold, yet a different code path
    fault = Fault("sync", 1, 0.00003)
    diagnosis = TraceAnalyzer(write_job(tmp_path, JobShape(faults=[fault], seed=seed))).diagnose()
    assert diagnosis.alarms, [f.headline() for f in diagnosis.findings[:3]]
    top = diagnosis.alarms[0]
    assert (top.rank, top.category) == (1, "sync")
    assert top.cost_s_per_step < 0.01 * diagnosis.step_s_median
    assert top.evidence["steps_with_extra_calls"] == 1.0


def test_extra_syncs_in_a_few_steps_only_do_not_alarm(tmp_path):
    diagnosis = TraceAnalyzer(write_job(tmp_path, JobShape(faults=[Fault("sync", 1, 0.00003, every=4)]))).diagnose()
    syncs = [f for f in diagnosis.findings if f.category == "sync"]
    assert syncs and not any(f.alarm for f in syncs)
    assert syncs[0].evidence["steps_with_extra_calls"] == pytest.approx(0.25)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_loader_that_stalls_every_other_step_is_found_against_its_quiet_steps(tmp_path, seed):
    # half of the steps pause: the rank's median step sits among the pauses, its quiet half does not
    shape = JobShape(faults=[Fault("data", 2, 0.15, every=2)], seed=seed, traced_wait=False)
    diagnosis = TraceAnalyzer(write_job(tmp_path, shape)).diagnose()
    assert diagnosis.alarms, [f.headline() for f in diagnosis.findings[:3]]
    top = diagnosis.alarms[0]
    assert (top.rank, top.category, top.localiser) == (2, "data_loading", "cross-step")
    assert top.evidence["pause_steps"] == [0, 2, 4, 6]
    assert top.evidence["others_slack_in_pause_steps_s"] == pytest.approx(0.15, rel=0.2)


def test_a_rank_slowest_at_every_call_site_alarms_without_victims(tmp_path):
    folder = write_job(tmp_path, JobShape(matmuls=10, faults=[Fault("compute", 2, 0.02)]))
    no_victims = dict(victim_share=100.0, strong_z=1e9)  # only the sign test can carry the alarm
    top = TraceAnalyzer(folder, Thresholds(**no_victims)).diagnose().alarms[0]
    assert (top.rank, top.category, top.function) == (2, "compute", "aten::mm")
    assert top.evidence["slowest_sites"] >= 10 and top.evidence["sign_p"] <= 0.001
    assert TraceAnalyzer(folder, Thresholds(sign_p=0.0, **no_victims)).diagnose().alarms == []


def test_sign_test_counts_sites_where_the_rank_is_strictly_slowest():
    ranks, n = [0, 1, 2, 3], 6
    rows = [
        {"rank": r, "domain": "host", "category": "compute", "function": "f", "site": s, "time_s": t}
        for s in range(n)
        for r, t in zip(ranks, [1.0, 2.0 if s < 5 else 1.0, 1.0, 1.5], strict=True)
    ]
    sites = pl.DataFrame(rows)
    one = slowest_sites(sites, ranks, 1, "f")
    assert (one["slowest_sites"], one["sites"]) == (5, 6)
    assert one["sign_p"] == pytest.approx(6 * 0.25**5 * 0.75 + 0.25**6, rel=1e-2)
    three = slowest_sites(sites, ranks, 3, "f")  # slowest only at the site where rank 1 is not
    assert three["slowest_sites"] == 1 and three["sign_p"] > 0.5


def test_victims_in_pause_steps_are_measured_over_the_usual_gap():
    # rank 0 pauses in steps 1 and 3; the others always wait 10 ms more than it, and 50 ms more in those steps
    slack = {0: [0.00, 0.00, 0.00, 0.00], 1: [0.01, 0.06, 0.01, 0.06], 2: [0.01, 0.06, 0.01, 0.06]}
    gap = {"domain": "host", "function": "<untraced: step end>", "category": "cpu_stall", "calls": 1, "time_s": 0.0}
    rows = [{"rank": r, "step": s, **gap, "wait_s": w} for r, ws in slack.items() for s, w in enumerate(ws)]
    steps = pl.DataFrame(rows)
    spans = pl.DataFrame([{"rank": r, "step": s, "dur_ns": 100_000_000} for r in slack for s in range(4)])
    assert Slack(steps, spans).in_steps(0, [1, 3]) == pytest.approx(0.05)
    assert Slack(steps, spans).in_steps(0, [0, 2]) == pytest.approx(-0.05)
