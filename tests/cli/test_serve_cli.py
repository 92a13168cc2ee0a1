"""``gpufleet serve``: help without the serving extra, the bench's JSON shape, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_helpers import run_main


def test_serve_help_works_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['fastapi'] = None\n"
        "from gpufleet.cli import main\nsys.argv = ['gpufleet', 'serve', '--help']\nmain()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "bench" in done.stdout and "--adapters" in done.stdout


def test_bench_json_has_every_system(monkeypatch, capsys):
    pytest.importorskip("torch")
    code, out, err = run_main(
        monkeypatch,
        capsys,
        "serve",
        "bench",
        "--base",
        "tiny-llama-random",
        "--requests",
        "8",
        "--popularity",
        "uniform",
        "--json",
    )
    assert code in (0, None), err
    result = json.loads(out)
    assert result["popularity"] == "uniform" and result["requests"] == 8
    for system in ("gpufleet", "per_adapter", "base_only"):
        row = result["systems"][system]
        assert row["tokens_per_s"] > 0 and row["p50_token_latency_ms"] > 0
    assert result["systems"]["gpufleet"]["generated_tokens"] == result["systems"]["base_only"]["generated_tokens"]


def test_bad_inputs_fail_in_one_line(monkeypatch, capsys, tmp_path):
    pytest.importorskip("torch")
    code, _, err = run_main(monkeypatch, capsys, "serve", "bench", "--popularity", "zipf")
    assert code == 2 and "distinct" in err
    code, _, err = run_main(monkeypatch, capsys, "serve", "--base", str(tmp_path / "nope"))
    assert code == 2 and "neither a model folder" in err
