"""The Aryl policies from the command line: JSON keys, bare --opt, the report, and bad inference input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import gpufleet

ARYL_KEYS = {"usage", "loaned_gpu_hours", "reclaims", "reclaim_preemptions", "scale_events", "elastic_jobs"}


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("aryl") / "jobs.csv"
    rows = ["submission_time,duration,num_gpu"]
    rows += [f"{i * 300},{1800 + (i * 911) % 20000},{[1, 2, 4, 8, 16][i % 5]}" for i in range(300)]
    path.write_text("\n".join(rows) + "\n")
    return path


COLUMNS = "submit=submission_time,duration=duration,gpus=num_gpu"


def test_aryl_variants_json(trace, tmp_path):
    report = tmp_path / "aryl.html"
    res = gpufleet(
        "simulate",
        "--trace",
        str(trace),
        "--columns",
        COLUMNS,
        "--gpus",
        "64",
        "--policy",
        "aryl-base,aryl",
        "--inference",
        "diurnal",
        "--json",
        "--report",
        str(report),
    )
    assert res.returncode == 0, res.stderr
    rows = {r["policy"]: r for r in json.loads(res.stdout)}
    assert set(rows) == {"aryl-base", "aryl"}
    for r in rows.values():
        assert set(r) >= ARYL_KEYS
        assert 0.0 <= r["usage"] <= 1.0
        assert r["finished"] == 300
    assert rows["aryl-base"]["loaned_gpu_hours"] == 0 and rows["aryl-base"]["scale_events"] == 0
    assert rows["aryl"]["loaned_gpu_hours"] > 0  # the diurnal trough leaves servers to loan
    assert rows["aryl"]["avg_jct_s"] < rows["aryl-base"]["avg_jct_s"]
    page = report.read_text()
    assert "Inference demand and servers on loan" in page and "servers reclaimed" in page


def test_bare_opt_applies_to_every_policy_that_has_it(trace):
    res = gpufleet(
        "simulate",
        "--trace",
        str(trace),
        "--columns",
        COLUMNS,
        "--gpus",
        "64",
        "--policy",
        "aryl,fifo",
        "--inference",
        "diurnal",
        "--opt",
        "reclaim=random",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    bad = gpufleet(
        "simulate", "--trace", str(trace), "--columns", COLUMNS, "--policy", "fifo", "--opt", "reclaim=random", "--json"
    )
    assert bad.returncode == 2
    assert "none of the chosen policies" in bad.stderr and "Traceback" not in bad.stderr


def test_bad_inference_csv_is_one_line(trace, tmp_path):
    load = tmp_path / "load.csv"
    load.write_text("time,servers_needed\n0,10\n600,-3\n1200,5\n")
    res = gpufleet(
        "simulate", "--trace", str(trace), "--columns", COLUMNS, "--policy", "aryl", "--inference", str(load), "--json"
    )
    assert res.returncode == 2
    assert "-3" in res.stderr and "line 3" in res.stderr and "load.csv" in res.stderr and "Traceback" not in res.stderr
