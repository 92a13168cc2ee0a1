"""Failures and predictive drains injected into simulated jobs (``gpufleet.sim.failures``), by hand-computed cases.

The base scene: 2 nodes x 8 GPUs, FIFO, hourly checkpoints, 60 s restart. j0 and j1 (8 GPUs, 10,000 s each)
start at 0 on nodes 0 and 1 (best fit takes node 0 first); j2 (8 GPUs, 5,000 s) arrives at 100 and waits.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import polars as pl
import pytest
from helpers import jobs_frame
from typer.testing import CliRunner

from gpufleet.errors import ConfigError
from gpufleet.sched.policy import make_policy
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.failure_run import comparison, run_failure_study
from gpufleet.sim.failures import (
    DRAIN_DOWN,
    FAIL_AVOIDED,
    FAIL_DOWN,
    NODE_UP,
    OutagePlan,
    OutageSettings,
    empty_alerts,
    empty_failures,
)
from gpufleet.sim.partition import Partition
from gpufleet.sim.result import SimResult
from gpufleet.sim.workload import Workload
from gpufleet.spec import load_cluster

CFG = SimConfig(checkpoint_interval_s=3600.0, restart_s=60.0, debug=True)
SCENE = [(0, 10_000, 8), (0, 10_000, 8), (100, 5_000, 8)]
H = 3600.0


def failures(*rows: tuple[int, float]) -> pl.DataFrame:
    """(fleet node, time_s) rows -> failure frame; the failing GPU is the node's GPU 3."""
    return pl.DataFrame(
        {
            "gpu": [n * 8 + 3 for n, _ in rows],
            "node": [n for n, _ in rows],
            "time_s": [t for _, t in rows],
            "xid": [79] * len(rows),
        },
        schema={"gpu": pl.UInt32, "node": pl.UInt32, "time_s": pl.Float64, "xid": pl.Int64},
    )


def alerts(*rows: tuple[int, float]) -> pl.DataFrame:
    """(fleet node, time_s) rows -> alert frame."""
    return pl.DataFrame(
        {
            "gpu": [n * 8 + 2 for n, _ in rows],
            "node": [n for n, _ in rows],
            "time_s": [t for _, t in rows],
            "score": [0.9] * len(rows),
        },
        schema={"gpu": pl.UInt32, "node": pl.UInt32, "time_s": pl.Float64, "score": pl.Float64},
    )


def run(
    rows,
    fails: pl.DataFrame | None,
    alert: pl.DataFrame | None = None,
    *,
    policy: str = "fifo",
    nodes: int = 2,
    config: SimConfig = CFG,
    settings: OutageSettings | None = None,
) -> SimResult:
    parts = [Partition("p", "v100", nodes, 8)]
    wl = Workload.from_frame(jobs_frame(rows))
    plan = None
    if fails is not None:
        plan = OutagePlan.build(fails, alert, parts, float(wl.submit[0]), settings or OutageSettings(repair_s=2 * H))
    return Simulator(wl, parts, make_policy(policy), config, plan).run()


def col(result: SimResult, name: str) -> list:
    return result.jobs.sort("job_id")[name].to_list()


# ------------------------------------------------------------------ failures
def test_failure_kills_the_job_on_its_node_and_the_node_stays_down_for_the_repair() -> None:
    r = run(SCENE, failures((0, 5000.0)))  # node 0 fails at 5,000 s; repair 2 h -> back at 12,200 s
    # j0 (node 0) had 5,000 s of progress: it keeps its 3,600 s checkpoint, loses 1,400 s, and restarts on
    # node 1 when j1 finishes (10,000 s): 60 s restore + 6,400 s left -> 16,460 s
    assert col(r, "finish_s") == [16_460.0, 10_000.0, 17_200.0]
    # j2 waits for node 0 until its repair ends (12,200 s) although it arrived long before
    assert col(r, "start_s") == [0.0, 0.0, 12_200.0]
    assert col(r, "interruptions") == [1, 0, 0]
    assert col(r, "preemptions") == [0, 0, 0]
    s = r.summary
    assert s["failures"] == 1 and s["job_interruptions"] == 1 and s["avoided_failures"] == 0
    assert s["lost_gpu_hours_failures"] == pytest.approx((1400 + 60) * 8 / H)
    assert s["lost_work_gpu_h"] == pytest.approx(1400 * 8 / H)
    assert s["drains"] == 0 and s["drain_gpu_hours"] == 0.0


def test_a_waiting_job_cannot_start_on_a_node_under_repair() -> None:
    # one node; j0 (4 GPUs) runs from 0, the node fails at 1,000 s (j0 loses all 1,000 s: no checkpoint yet);
    # j1 (4 GPUs) arrives at 1,500 s and would fit, but the node is under repair (2 h) until 8,200 s
    r = run([(0, 3000, 4), (1500, 100, 4)], failures((0, 1000.0)), nodes=1)
    assert col(r, "start_s") == [0.0, 8200.0]
    # j0 restarts then too, with a 60 s restore and all 3,000 s to redo
    assert col(r, "finish_s") == [8200.0 + 60 + 3000, 8300.0]
    assert r.summary["lost_gpu_hours_failures"] == pytest.approx((1000 + 60) * 4 / H)


def test_failure_on_an_idle_node_kills_nothing() -> None:
    r = run(SCENE, failures((1, 12_000.0)))  # from 10,000 s only j2 runs, on node 0: node 1 is idle
    assert r.summary["job_interruptions"] == 0 and r.summary["failures"] == 1
    assert col(r, "finish_s") == [10_000.0, 10_000.0, 15_000.0]


def test_failures_after_the_last_job_and_beyond_the_cluster_are_ignored() -> None:
    # fleet node 1 is cluster node 1 (j1's node); fleet node 3 is not in the 2-node cluster; fleet time 0 is
    # the first submit (1,000 s)
    rows = [(1000, 10_000, 8), (1000, 10_000, 8)]
    r = run(rows, failures((1, 4000.0), (3, 4000.0), (0, 50_000.0)))
    assert col(r, "interruptions") == [0, 1]
    # j1 failed at 5,000 s after 4,000 s of progress: back to 3,600 s; node 0 is free at 11,000 s
    assert col(r, "finish_s") == [11_000.0, 11_000.0 + 60 + 6400]
    assert r.summary["failures"] == 1  # the one at fleet 50,000 s came after the last job


# ------------------------------------------------------------------ drains
def test_a_drain_before_the_failure_saves_the_job() -> None:
    settings = OutageSettings(repair_s=2 * H, drain_s=2 * H, checkpoint_save_s=60.0)
    r = run(SCENE, failures((0, 5000.0)), alerts((0, 4000.0)), settings=settings)
    # drained at 4,000 s: j0 checkpoints (keeps all 4,000 s); the node fails during the inspection, so it
    # is out until max(4,000 + 7,200, 5,000 + 7,200) = 12,200 s. j0 restarts on node 1 at 10,000 s and
    # pays 60 s save + 60 s restore: 10,000 + 120 + 6,000 = 16,120 s
    assert col(r, "finish_s") == [16_120.0, 10_000.0, 17_200.0]
    assert col(r, "interruptions") == [0, 0, 0]
    s = r.summary
    assert s["job_interruptions"] == 0 and s["lost_gpu_hours_failures"] == 0.0 and s["lost_work_gpu_h"] == 0.0
    assert s["failures"] == 1 and s["avoided_failures"] == 1
    assert (s["drains"], s["drain_true"], s["drain_false"]) == (1, 1, 0)
    assert s["drain_gpu_hours"] == pytest.approx(16.0) and s["false_alarm_gpu_hours"] == 0.0
    assert s["drain_moves"] == 1 and s["drain_cost_gpu_hours"] == pytest.approx(120 * 8 / H)


def test_a_false_alarm_costs_drain_hours_times_the_node_gpus() -> None:
    settings = OutageSettings(repair_s=2 * H, drain_s=3 * H, checkpoint_save_s=0.0)
    r = run(SCENE, empty_failures(), alerts((1, 1000.0)), settings=settings)
    s = r.summary
    assert (s["drains"], s["drain_true"], s["drain_false"]) == (1, 0, 1)
    assert s["false_alarm_gpu_hours"] == s["drain_gpu_hours"] == pytest.approx(3 * 8)
    assert s["failures"] == 0 and s["job_interruptions"] == 0
    # j1 (node 1) moved at 1,000 s and lost nothing: it restarts on node 0 when j0 finishes, with a 60 s
    # restore; j2 (behind j1 in FIFO) gets node 1 when its inspection ends at 1,000 + 10,800 s
    assert col(r, "finish_s") == [10_000.0, 10_000.0 + 60 + 9000, 11_800.0 + 5000]


def test_alerts_on_a_drained_node_merge_and_on_a_node_under_repair_are_ignored() -> None:
    settings = OutageSettings(repair_s=2 * H, drain_s=H)
    fails = failures((1, 20_000.0))
    # node 0: three alerts inside one 1 h inspection (one drain), then one after it (a second drain);
    # node 1: an alert while under repair (ignored)
    al = alerts((0, 1000.0), (0, 2000.0), (0, 4500.0), (0, 5000.0), (1, 21_000.0))
    plan = OutagePlan.build(fails, al, [Partition("p", "v100", 2, 8)], 0.0, settings)
    events = list(zip(plan.time, plan.kind, plan.node, strict=True))
    assert events == [
        (1000.0, DRAIN_DOWN, 0),
        (4600.0, NODE_UP, 0),
        (5000.0, DRAIN_DOWN, 0),
        (8600.0, NODE_UP, 0),
        (20_000.0, FAIL_DOWN, 1),
        (27_200.0, NODE_UP, 1),
    ]
    s = plan.summary(len(plan))
    assert (s["drains"], s["drain_false"], s["failures"]) == (2, 2, 1)
    assert s["false_alarm_gpu_hours"] == pytest.approx(2 * 8)


def test_a_failure_on_a_drained_node_extends_the_outage_to_its_repair() -> None:
    settings = OutageSettings(repair_s=10 * H, drain_s=H)
    plan = OutagePlan.build(failures((0, 1800.0)), alerts((0, 0.0)), [Partition("p", "v100", 1, 8)], 0.0, settings)
    assert list(zip(plan.time, plan.kind, strict=True)) == [
        (0.0, DRAIN_DOWN),
        (1800.0, FAIL_AVOIDED),
        (1800.0 + 10 * H, NODE_UP),
    ]
    assert plan.drain_true == [True, False, False]
    # without the predictor the alert is ignored and the failure takes the node down
    base = OutagePlan.build(failures((0, 1800.0)), None, [Partition("p", "v100", 1, 8)], 0.0, settings)
    assert base.kind == [FAIL_DOWN, NODE_UP]


def test_the_predictor_off_setting_ignores_alerts() -> None:
    off = OutageSettings(repair_s=2 * H, drain=False)
    r = run(SCENE, failures((0, 5000.0)), alerts((0, 4000.0)), settings=off)
    assert col(r, "finish_s") == [16_460.0, 10_000.0, 17_200.0]
    assert r.summary["drains"] == 0


# ------------------------------------------------------------------ no outages, bad input
@pytest.mark.parametrize("policy", ["fifo", "sjf", "srtf", "las", "tiresias"])
def test_no_outages_gives_the_same_run_as_the_plain_engine(policy: str) -> None:
    rows = [(i * 37.0, 500.0 + (i * 613) % 4000, (1, 2, 4, 8, 16)[i % 5]) for i in range(60)]
    config = SimConfig(checkpoint_interval_s=600.0, restart_s=30.0, debug=True)
    plain = run(rows, None, policy=policy, config=config)
    empty = run(rows, empty_failures(), empty_alerts(), policy=policy, config=config)
    assert empty.jobs.drop("interruptions").equals(plain.jobs)
    assert empty.timeline.equals(plain.timeline)
    for key, value in plain.summary.items():
        if key != "wall_s":
            assert empty.summary[key] == value or (value != value and empty.summary[key] != empty.summary[key])
    assert empty.summary["failures"] == empty.summary["drains"] == 0


def test_a_frame_without_the_needed_columns_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="time_s"):
        OutagePlan.build(pl.DataFrame({"node": [1]}), None, [Partition("p", "v100", 1, 8)])
    with pytest.raises(ConfigError, match="repair"):
        OutageSettings(repair_s=0)


def two_node_cluster(tmp_path: Path) -> Path:
    path = tmp_path / "c.toml"
    path.write_text('name = "t"\n[[pools]]\nname = "t"\nkind = "training"\ngpu = "v100"\nnodes = 2\n')
    return path


def test_study_runs_each_policy_without_and_with_the_predictor(tmp_path: Path) -> None:
    cluster = load_cluster(two_node_cluster(tmp_path))
    res = run_failure_study(
        jobs_frame(SCENE),
        cluster,
        ["fifo", "sjf"],
        failures((0, 5000.0)),
        alerts((0, 4000.0)),
        CFG,
        OutageSettings(repair_s=2 * H, drain_s=2 * H),
    )
    assert [r.policy for r in res] == ["fifo", "fifo+predictor", "sjf", "sjf+predictor"]
    table = comparison(res)
    assert table["predictor"].to_list() == [False, True, False, True]
    assert table["job_interruptions"].to_list() == [1, 0, 1, 0]


def test_failures_and_drains_hit_the_aryl_policies_too(tmp_path: Path) -> None:
    cluster = load_cluster(two_node_cluster(tmp_path))
    res = run_failure_study(
        jobs_frame(SCENE),
        cluster,
        ["aryl-base", "aryl"],
        failures((0, 5000.0)),
        alerts((0, 4000.0)),
        CFG,
        OutageSettings(repair_s=2 * H, drain_s=2 * H),
    )
    assert [r.policy for r in res] == ["aryl-base", "aryl-base+predictor", "aryl", "aryl+predictor"]
    assert comparison(res)["job_interruptions"].to_list() == [1, 0, 1, 0]
    base = res[0]
    # j0 (server 0) dies at 5000 s and keeps its 3600 s checkpoint; node 0 is down until 12,200 s. j1 ends at
    # 10,000 s; the shorter j2 takes its server (10,000-15,000 s); j0 resumes at 12,200 s: 60 s restart, 6400 s
    assert base.jobs["finish_s"].to_list() == [pytest.approx(18_660.0), 10_000.0, 15_000.0]
    assert base.jobs["interruptions"].to_list() == [1, 0, 0]
    assert base.summary["lost_work_gpu_h"] == pytest.approx(1400.0 * 8 / H)
    assert res[1].summary["drain_moves"] == 1 and res[1].summary["finished"] == 3


# ------------------------------------------------------------------ command line
def test_cli_compares_policies_without_and_with_the_predictor(monkeypatch, tmp_path: Path) -> None:
    from gpufleet.cli import app

    try:
        import gpufleet.health.events as api
    except ImportError:  # the health side is not there yet: stand in for it
        api = types.ModuleType("gpufleet.health.events")
        monkeypatch.setitem(sys.modules, "gpufleet.health.events", api)
    seen: dict[str, object] = {}

    def fake_failures(path):
        seen["fleet"] = str(path)
        return failures((0, 5000.0))

    def fake_alerts(model, path):
        seen["model"] = str(model)
        return alerts((0, 4000.0))

    monkeypatch.setattr(api, "failure_events", fake_failures, raising=False)
    monkeypatch.setattr(api, "predicted_alerts", fake_alerts, raising=False)
    trace = tmp_path / "jobs.csv"
    jobs_frame(SCENE).write_csv(trace)
    cluster = two_node_cluster(tmp_path)
    args = [
        "simulate",
        "--trace",
        str(trace),
        "--cluster",
        str(cluster),
        "--policy",
        "fifo,sjf",
        "--failures",
        str(tmp_path / "fleet.parquet"),
        "--predictor",
        str(tmp_path / "model.zip"),
        "--repair-hours",
        "2",
        "--drain-hours",
        "2",
        "--no-progress",
    ]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert seen == {"fleet": str(tmp_path / "fleet.parquet"), "model": str(tmp_path / "model.zip")}
    assert [(r["policy"], r["predictor"]) for r in rows] == [
        ("fifo", False),
        ("fifo", True),
        ("sjf", False),
        ("sjf", True),
    ]
    fifo, fifo_pred = rows[0], rows[1]
    # --checkpoint-interval defaults to 1 h with --failures: the hand-computed numbers of the first test
    assert fifo["job_interruptions"] == 1 and fifo["lost_gpu_hours_failures"] == pytest.approx(1460 * 8 / H)
    assert fifo_pred["job_interruptions"] == 0 and fifo_pred["avoided_failures"] == 1
    assert fifo_pred["drain_true"] == 1 and fifo_pred["false_alarm_gpu_hours"] == 0.0
    table = CliRunner().invoke(app, [*args, "--wide"])
    assert table.exit_code == 0, table.output
    assert "fifo+predictor" in table.stdout and "false-alarm GPU-h" in table.stdout
    bad = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--predictor", "m.pkl"])
    assert bad.exit_code != 0


def test_cli_runs_aryl_and_tiresias_with_failures_and_the_predictor(monkeypatch, tmp_path: Path) -> None:
    from gpufleet.cli import app

    try:
        import gpufleet.health.events as api
    except ImportError:  # the health side is not there yet: stand in for it
        api = types.ModuleType("gpufleet.health.events")
        monkeypatch.setitem(sys.modules, "gpufleet.health.events", api)
    monkeypatch.setattr(api, "failure_events", lambda path: failures((0, 5000.0)), raising=False)
    monkeypatch.setattr(api, "predicted_alerts", lambda model, path: alerts((0, 4000.0)), raising=False)
    trace = tmp_path / "jobs.csv"
    jobs_frame(SCENE).write_csv(trace)
    cluster = tmp_path / "c.toml"
    cluster.write_text(
        'name = "t"\n[[pools]]\nname = "t"\nkind = "training"\ngpu = "v100"\nnodes = 2\n'
        '[[pools]]\nname = "i"\nkind = "inference"\ngpu = "t4"\nnodes = 2\n'
    )
    args = ["simulate", "--trace", str(trace), "--cluster", str(cluster), "--policy", "aryl,tiresias"]
    args += ["--failures", str(tmp_path / "f.parquet"), "--predictor", str(tmp_path / "m.zip"), "--no-progress"]
    res = CliRunner().invoke(app, [*args, "--repair-hours", "2", "--drain-hours", "2", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [(r["policy"], r["predictor"]) for r in rows] == [
        ("aryl", False),
        ("aryl", True),
        ("tiresias", False),
        ("tiresias", True),
    ]
    assert [r["job_interruptions"] for r in rows] == [1, 0, 1, 0]
    assert all(r["finished"] == 3 and "usage" in r for r in rows)
    assert "loaned_gpu_hours" in rows[0]
