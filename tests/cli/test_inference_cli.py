"""`gpufleet traces inference`: JSON contract, table output, CSV and HTML outputs, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import cli_helpers
import polars as pl
import pytest
from typer.testing import CliRunner

from gpufleet import cli

runner = CliRunner()

SUMMARY_KEYS = {
    "source",
    "cluster",
    "days",
    "name",
    "pool_servers",
    "steps",
    "mean_utilisation",
    "peak_utilisation",
    "trough_utilisation",
    "mean_servers_needed",
    "mean_idle_servers",
    "hourly_utilisation",
}


def invoke(*args: str):
    res = runner.invoke(cli.app, ["traces", "inference", *args])
    assert res.exit_code == 0, (res.output, res.exception)
    return res


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``gpufleet traces inference ARGS`` through ``cli.main``: (status, stdout, stderr)."""
    return cli_helpers.run_main(monkeypatch, capsys, "traces", "inference", *args)


def test_json_contract_genai_default_cluster() -> None:
    d = json.loads(invoke("genai", "--json").stdout)
    assert set(d) >= SUMMARY_KEYS
    assert d["pool_servers"] == 96  # the bundled cluster's inference pool: 96 nodes
    assert d["days"] == 14 and d["steps"] == 14 * 288
    assert 0 < d["mean_utilisation"] < 0.6 and d["peak_utilisation"] == 1.0 and d["trough_utilisation"] == 0.0
    assert d["mean_idle_servers"] == pytest.approx(96 * (1 - d["mean_utilisation"]))
    assert len(d["hourly_utilisation"]) == 24


def test_options_reach_the_source() -> None:
    d = json.loads(invoke("genai", "--json", "--days", "2", "--step", "3600", "--headroom", "0").stdout)
    assert d["steps"] == 48
    d = json.loads(invoke("diurnal", "--json", "--days", "1", "--step", "600").stdout)
    assert d["steps"] == 144 and 0.45 < d["mean_utilisation"] < 0.65
    d = json.loads(invoke("none", "--json").stdout)
    assert d["mean_utilisation"] == 0.0 and d["mean_idle_servers"] == 96


def test_table_output() -> None:
    out = invoke("genai").stdout
    for needle in ("mean utilisation", "mean idle servers", "96 servers", "hour of day", "18-23"):
        assert needle in out


def test_csv_and_plot_outputs(tmp_path: Path) -> None:
    csv_out, html = tmp_path / "load.csv", tmp_path / "load.html"
    invoke("diurnal", "--days", "2", "--csv", str(csv_out), "--plot", str(html))
    frame = pl.read_csv(csv_out)
    assert frame.columns == ["time_s", "servers_needed", "idle_servers"] and frame.height == 2 * 288
    assert (frame["servers_needed"] + frame["idle_servers"] == 96).all()
    text = html.read_text()
    assert "Inference servers needed and idle" in text and "By hour of day" in text


def test_csv_source_with_cluster(tmp_path: Path) -> None:
    load = tmp_path / "my_load.csv"
    load.write_text("time,servers_needed\n0,4\n3600,8\n7200,2\n")
    cluster = tmp_path / "c.toml"
    cluster.write_text(
        'name = "small"\n[[pools]]\nname = "t"\nkind = "training"\ngpu = "v100"\nnodes = 2\n'
        '[[pools]]\nname = "i"\nkind = "inference"\ngpu = "t4"\nnodes = 10\n'
    )
    d = json.loads(invoke(str(load), "--cluster", str(cluster), "--days", "1", "--json").stdout)
    assert d["pool_servers"] == 10 and d["cluster"] == "small" and d["steps"] == 3
    assert d["peak_utilisation"] == 0.8 and d["trough_utilisation"] == 0.2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("time,servers_needed\n0,1\n60,-3\n", "line 3"),
        ("when,servers_needed\n0,1\n", "name the columns 'time'"),
        ("time,servers_needed\n0,1\n60,500\n", "exceeds the pool of 96"),
    ],
)
def test_bad_csv_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path: Path, text: str, needle: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    code, stdout, stderr = run_main(monkeypatch, capsys, str(bad), "--json")
    assert code == 2 and stdout == ""
    assert stderr.strip().count("\n") == 0
    assert stderr.startswith("error:") and "bad.csv" in stderr and needle in stderr


def test_other_errors_exit_2(monkeypatch, capsys, tmp_path: Path) -> None:
    code, _, stderr = run_main(monkeypatch, capsys, "genaii")
    assert code == 2 and "genai, diurnal, none" in stderr
    code, _, stderr = run_main(monkeypatch, capsys, "diurnal", "--headroom", "0.2")
    assert code == 2 and "no option(s) headroom" in stderr
    cluster = tmp_path / "train_only.toml"
    cluster.write_text('name = "t"\n[[pools]]\nname = "t"\nkind = "training"\ngpu = "v100"\nnodes = 2\n')
    code, _, stderr = run_main(monkeypatch, capsys, "genai", "--cluster", str(cluster))
    assert code == 2 and "no inference pool" in stderr and stderr.strip().count("\n") == 0
