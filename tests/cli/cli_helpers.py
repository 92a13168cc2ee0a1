"""Running the real command line, in a subprocess as a user does or in-process through ``cli.main``;
shared by the CLI tests."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpufleet import cli


def gpufleet(*args: str) -> subprocess.CompletedProcess:
    """``gpufleet ARGS...`` in a fresh interpreter; stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-m", "gpufleet.cli", *args], capture_output=True, text=True, timeout=300)


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run ``gpufleet.cli.main`` in-process (gpufleet errors -> one line, exit 2): (status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["gpufleet", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err
