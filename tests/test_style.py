"""The tree is ``ruff`` clean and ``ruff format``-ed, checked by the suite so that CI checks it too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "src", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"ruff {' '.join(args)} found:\n{done.stdout}{done.stderr}"
