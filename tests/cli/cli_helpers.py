"""Running the real command line in a subprocess, as a user does; shared by the CLI tests."""

from __future__ import annotations

import subprocess
import sys


def gpufleet(*args: str) -> subprocess.CompletedProcess:
    """``gpufleet ARGS...`` in a fresh interpreter; stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-m", "gpufleet.cli", *args], capture_output=True, text=True,
                          timeout=300)
