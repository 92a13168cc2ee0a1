"""``gpufleet meta``: help without torch, prepare's table, evaluate's JSON against the plain baseline, and
one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_main


def test_meta_help_works_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from gpufleet.cli import main\nsys.argv = ['gpufleet', 'meta', '--help']\nmain()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for command in ("prepare", "train", "evaluate", "bench"):
        assert command in done.stdout


def test_train_without_torch_names_the_extra():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from gpufleet.cli import main\nsys.argv = ['gpufleet', 'meta', 'train', 'tasks']\nmain()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "gpufleet[torch]" in done.stderr and "Traceback" not in done.stderr


def _clicks(path: Path) -> Path:
    rng = np.random.default_rng(0)
    lines = ["uid,iid,ts,genre"]
    for u in range(50):
        for k, item in enumerate(rng.choice(60, 25, replace=False)):
            lines.append(f"u{u},{item},{100 * u + k},{item % 3}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("meta-cli")
    code, out, err = _run(
        [
            "meta",
            "prepare",
            str(_clicks(folder / "clicks.csv")),
            "--columns",
            "user=uid,item=iid,time=ts",
            "--sparse",
            "genre",
            "--support",
            "8",
            "--query",
            "10",
            "-o",
            str(folder / "tasks"),
        ]
    )
    assert code == 0, err
    assert "cold-start" in out and "train" in out
    return folder / "tasks"


def _run(args: list[str]) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, "-m", "gpufleet.cli", *args], capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def test_train_then_evaluate_reports_meta_and_plain_figures(prepared, tmp_path):
    pytest.importorskip("torch")
    model = tmp_path / "model.pt"
    code, _, err = _run(
        ["meta", "train", str(prepared), "--ranks", "1", "--tasks-per-step", "8", "--epochs", "2", "-o", str(model)]
    )
    assert code == 0, err
    code, out, err = _run(["meta", "evaluate", str(model), str(prepared), "--json"])
    assert code == 0, err
    result = json.loads(out)
    for key in ("auc", "gauc", "ndcg_at_10", "tasks"):
        assert key in result and key in result["baseline"] and key in result["baseline_finetuned"]
    assert result["tasks"] == 10 and result["split"] == "cold"
    assert 0.0 <= result["auc"] <= 1.0 and 0.0 <= result["baseline"]["ndcg_at_10"] <= 1.0


def test_bad_inputs_fail_in_one_line(monkeypatch, capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("uid,iid,click\n1,2,1\n1,3,yes\n")
    code, _, err = run_main(
        monkeypatch,
        capsys,
        "meta",
        "prepare",
        str(bad),
        "--columns",
        "user=uid,item=iid,label=click",
        "-o",
        str(tmp_path / "t"),
    )
    assert code == 2 and "click" in err and "row 2" in err
    code, _, err = run_main(monkeypatch, capsys, "meta", "prepare", str(bad), "-o", str(tmp_path / "t"))
    assert code == 2 and "--columns" in err
    code, _, err = run_main(monkeypatch, capsys, "meta", "evaluate", str(tmp_path / "none.pt"), str(tmp_path))
    assert code == 2 and "no such model file" in err


# every test here launches ranks (torchrun or gloo processes): one such test at a time across xdist workers
pytestmark = pytest.mark.multiprocess
