"""``gpufleet diagnose`` as a user runs it: folder as the first argument, JSON, report, errors in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cli_helpers import gpufleet

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diagnose"))
from trace_builder import Fault, JobShape, write_job


def test_folder_first_json_findings_and_report(tmp_path):
    folder = write_job(tmp_path / "traces", JobShape(faults=[Fault("data", 2, 0.03)]))
    report = tmp_path / "diag.html"
    r = gpufleet("diagnose", str(folder), "--json", "--report", str(report))
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    top = payload["findings"][0]
    assert {"rank", "function", "category", "cost_s_per_step", "score", "evidence"} <= set(top)
    assert (top["rank"], top["category"]) == (2, "data_loading")
    assert payload["ranks"] == [0, 1, 2, 3] and payload["missing_ranks"] == []
    page = report.read_text()
    assert "Findings" in page and "Function time by rank" in page and "enumerate(DataLoader)" in page


def test_table_output_and_quiet_healthy_job(tmp_path):
    folder = write_job(tmp_path / "traces", JobShape(seed=3))
    r = gpufleet("diagnose", str(folder))
    assert r.returncode == 0, r.stderr
    assert "No finding above the alarm thresholds" in r.stdout


def test_functions_subcommand(tmp_path):
    folder = write_job(tmp_path / "traces", JobShape())
    r = gpufleet("diagnose", "functions", str(folder), "--rank", "1", "--top", "3", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert len(rows) == 3 and {row["rank"] for row in rows} == {1}
    assert rows[0]["total_s"] >= rows[-1]["total_s"]


def test_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "rank-0.json"
    bad.write_text('{"traceEvents": [{"ph": "X", ')
    r = gpufleet("diagnose", str(bad))
    assert r.returncode == 2
    assert "rank-0.json: trace JSON ends early at offset" in r.stderr and "Traceback" not in r.stderr
    r = gpufleet("diagnose", str(tmp_path / "nope"))
    assert r.returncode == 2 and "no such file or folder" in r.stderr


def test_diff_table_json_report_and_errors(tmp_path):
    control = write_job(tmp_path / "control", JobShape(noise=0.0))
    test = write_job(tmp_path / "test", JobShape(noise=0.0, faults=[Fault("compute", r, 0.01) for r in range(4)]))
    r = gpufleet("diagnose", "diff", str(control), str(test), "--top", "5")
    assert r.returncode == 0, r.stderr
    assert "Explained by" in r.stdout and "aten::mm" in r.stdout and "slower" in r.stdout
    report = tmp_path / "diff.html"
    r = gpufleet("diagnose", "diff", str(control), str(test), "--json", "--report", str(report))
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["step_change_s"] > 0.009 and payload["explained_by"][0]["function"] == "aten::mm"
    assert {"function", "change", "control_calls_per_step", "test_s_per_step", "delta_s_per_step"} <= set(
        payload["ops"][0]
    )
    page = report.read_text()
    assert "What explains the step-time change" in page and "aten::mm" in page
    r = gpufleet("diagnose", "diff", str(control), str(tmp_path / "nope"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
