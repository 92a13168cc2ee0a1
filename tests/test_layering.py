"""The layering of DESIGN.md holds: ``lint-imports`` keeps every contract in ``pyproject.toml``.

The contracts say which package may import which (cli on top, spec at the bottom, report used and never
using, sched blind to the simulator) and that no two sibling modules import each other, at any depth.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports() -> list[str]:
    """The command that runs import-linter: its script beside this interpreter, on PATH, or its click command."""
    beside = Path(sys.executable).with_name("lint-imports")
    if beside.exists():
        return [str(beside)]
    if (exe := shutil.which("lint-imports")) is not None:
        return [exe]
    return [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]


def test_contracts_are_declared() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    assert config["root_package"] == "gpufleet"
    assert config.get("exclude_type_checking_imports", False) is False  # TYPE_CHECKING imports count too
    kinds = {contract["type"] for contract in config["contracts"]}
    assert {"layers", "forbidden", "acyclic_siblings"} <= kinds


def test_lint_imports_keeps_every_contract() -> None:
    done = subprocess.run(
        [*_lint_imports(), str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, f"lint-imports broke a layering contract:\n{report}"
    assert "0 broken" in report, report
