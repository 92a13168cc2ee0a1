"""The default tables fit 100 columns with nothing cut; ``--wide`` shows every column."""

from __future__ import annotations

import io

from rich.console import Console

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
    for heading in ("p95 queue", "makespan", "lost GPU-h", "loaned GPU-h", "reclaims", "scale events", "wall"):
        assert heading in text
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
