"""The default tables fit 100 columns with nothing cut; ``--wide`` shows every column."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import gpufleet
from gpufleet import cli
from gpufleet.cli import common
from gpufleet.cli.simulate import failure_table, summary_table

#: A summary row as large as the bundled Philly run makes them (Aryl's columns and the usage included).
ROW = {
    "policy": "aryl-elastic",
    "jobs": 82_247,
    "finished": 82_247,
    "avg_jct_s": 210_600.0,
    "p99_jct_s": 725_000.0,
    "avg_queue_s": 196_200.0,
    "p95_queue_s": 423_000.0,
    "gpu_util": 0.668,
    "util_window": 0.912,
    "usage": 0.429,
    "makespan_s": 9.4e6,
    "preemptions": 351_011,
    "lost_work_gpu_h": 12_345.0,
    "loaned_gpu_hours": 463_530.0,
    "reclaims": 82_063,
    "reclaim_preemptions": 2_380,
    "scale_events": 104_803,
    "wall_s": 13.7,
}


def _render(table, width: int = 100) -> list[str]:
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None).print(table)
    return buffer.getvalue().splitlines()


def test_default_summary_fits_100_columns_uncut():
    lines = _render(summary_table([ROW, {**ROW, "policy": "tiresias"}], "philly on default (640 GPUs)", wide=False))
    assert max(len(line) for line in lines) <= 100
    text = "\n".join(lines)
    assert "…" not in text
    for cell in ("82,247/82,247", "58.5 h", "8.4 d", "54.5 h", "66.8 %", "42.9 %", "351,011", "avg queue", "preempt."):
        assert cell in text
    assert "--wide" in text and "makespan" not in text


def test_wide_summary_has_every_column():
    text = "\n".join(_render(summary_table([ROW], "t", wide=True), width=250))
    for heading in ("p95 queue", "util window", "makespan", "lost GPU-h", "loaned GPU-h", "reclaims", "wall"):
        assert heading in text
    assert "scale events" in text and "91.2 %" in text
    assert "463,530" in text and "13.70 s" in text and "--wide" not in text


def test_summary_with_a_failure_label_fits():
    lines = _render(summary_table([{**ROW, "policy": "tiresias+predictor"}], "t", wide=False))
    assert max(len(line) for line in lines) <= 100 and "…" not in "\n".join(lines)


def test_default_failure_table_columns(monkeypatch):
    import polars as pl

    import gpufleet.sim.failure_run as failure_run

    frame = pl.DataFrame(
        [
            {
                "policy": "tiresias",
                "predictor": True,
                "failures": 1_234,
                "job_interruptions": 12_345,
                "lost_gpu_hours_failures": 123_456.7,
                "drains": 2_000,
                "drain_true": 1_500,
                "drain_false": 500,
                "false_alarm_gpu_hours": 9_999.9,
                "avoided_failures": 1_000,
                "avg_jct_s": 30_600.0,
                "finished": 82_247,
                "jobs": 82_247,
            }
        ]
    )
    monkeypatch.setattr(failure_run, "comparison", lambda results: frame)
    lines = _render(failure_table([], wide=False))
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 100 and "…" not in text
    assert "123,456.7" in text and "false-alarm" not in text
    assert "false-alarm GPU-h" in "\n".join(_render(failure_table([], wide=True), width=200))


# -- diagnose and health: the default tables of the real commands on bundled or tiny generated data ----------

STRAGGLERS = Path(gpufleet.__file__).parent / "data" / "stragglers"
KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"
runner = CliRunner()


def _command(monkeypatch, *args: str) -> list[str]:
    """The stdout lines of ``gpufleet ARGS`` in-process, tables drawn as a pipe draws them (160 columns)."""
    monkeypatch.setattr(common.out, "width", 160)
    res = runner.invoke(cli.app, list(args))
    assert res.exit_code == 0, (res.output, res.exception)
    return res.stdout.splitlines()


def _assert_fits(lines: list[str]) -> str:
    """Every table line fits 100 columns and nothing is cut with an ellipsis; the text back."""
    table = [line for line in lines if line[:1] in "┏┃┡│└" or line.strip()[:1] in "┏┃┡│└"]
    assert table, "no table printed"
    assert max(len(line) for line in table) <= 100, "\n".join(table)
    text = "\n".join(lines)
    assert "…" not in text
    return text


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("kineto")
    for rank in (0, 1):
        name = f"trace_filter__sampled_rank-{rank}.json.gz"
        shutil.copy(KINETO / name, folder / name)
    return folder


def test_diagnose_findings_fit_and_wide_adds_evidence(monkeypatch, two_ranks):
    text = _assert_fits(_command(monkeypatch, "diagnose", str(two_ranks), "--all"))
    assert "ms/step" in text and "┃ evidence" not in text and "--wide adds the evidence" in text
    assert "aten::clone" in text and "0.32" in text
    wide = "\n".join(_command(monkeypatch, "diagnose", str(two_ranks), "--all", "--wide"))
    assert "┃ evidence" in wide and "share_of_step_on_every_rank=0.00" in wide and "steps_with_extra_calls=" in wide


def test_diagnose_functions_fit_and_wide_has_every_column(monkeypatch, two_ranks):
    text = _assert_fits(_command(monkeypatch, "diagnose", "functions", str(two_ranks), "--top", "3"))
    assert "calls/step" in text and "37.7%" in text and "p95 ms" not in text and "--wide" in text
    wide = "\n".join(_command(monkeypatch, "diagnose", "functions", str(two_ranks), "--top", "3", "--wide"))
    assert "p95 ms" in wide and "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t" in wide


@pytest.mark.parametrize("job", sorted(p.name for p in STRAGGLERS.glob("*.csv")))
def test_diagnose_stragglers_fit_on_the_bundled_jobs(monkeypatch, job):
    text = _assert_fits(_command(monkeypatch, "diagnose", "stragglers", str(STRAGGLERS / job)))
    for heading in ("section", "relative", "straggler", "slow from step", "slowdown"):
        assert heading in text
    assert "individual" not in text and "--wide" in text
    wide = "\n".join(_command(monkeypatch, "diagnose", "stragglers", str(STRAGGLERS / job), "--wide"))
    assert "individual" in wide and "recovered" in wide


def test_diagnose_stragglers_cells_are_whole(monkeypatch):
    text = _assert_fits(_command(monkeypatch, "diagnose", "stragglers", str(STRAGGLERS / "alibaba_pai_job_1_norm.csv")))
    for cell in ("429.5", "0.987", "1811", "1.98"):
        assert cell in text


def test_diagnose_breakdown_fits(monkeypatch, two_ranks):
    text = _assert_fits(_command(monkeypatch, "diagnose", "breakdown", str(two_ranks)))
    assert "comm overlapped by compute %" in text


HEALTH_SMALL = ["--window", "3d", "--horizon", "48h", "--budget", "0.02"]


@pytest.fixture(scope="module")
def health_fleet(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("health_width") / "fleet.parquet"
    args = ["health", "generate", "-o", str(path), "--gpus", "128", "--days", "30", "--seed", "4"]
    res = runner.invoke(cli.app, [*args, "--failure-scale", "80"])
    assert res.exit_code == 0, res.output
    return path


def test_health_evaluate_fits(monkeypatch, health_fleet):
    args = ["--models", "gbdt", "--train-span", "14d", "--sliding", "14d", *HEALTH_SMALL]
    text = _assert_fits(_command(monkeypatch, "health", "evaluate", str(health_fleet), *args))
    for heading in ("model", "mode", "alerts", "precision", "recall", "F1", "lead h"):
        assert heading in text
    assert "sliding" in text and "%" in text


def test_health_predict_fits(monkeypatch, health_fleet):
    model = health_fleet.with_name("model.zip")
    args = ["--model", "gbdt", "--train-span", "10d", "--calibrate", "5d", "--until", "20d", *HEALTH_SMALL]
    res = runner.invoke(cli.app, ["health", "train", str(health_fleet), "-o", str(model), *args])
    assert res.exit_code == 0, res.output
    text = _assert_fits(_command(monkeypatch, "health", "predict", str(model), str(health_fleet), "--top", "5"))
    for heading in ("rank", "gpu", "node", "score", "probability", "alert"):
        assert heading in text
