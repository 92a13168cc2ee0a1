"""Launching meta-training on local processes: ``python -m MODULE`` directly for one rank, under torchrun for
more, with the CPU threads shared between the ranks."""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["run_local", "torchrun_command"]


def torchrun_command(ranks: int, module: str, args: list[str]) -> list[str]:
    """The command that runs ``python -m module args`` on ``ranks`` local processes under torchrun."""
    if ranks == 1:
        return [sys.executable, "-m", module, *args]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        "-m",
        module,
        *args,
    ]


def run_local(ranks: int, module: str, args: list[str]) -> int:
    """Run :func:`torchrun_command` with OMP threads split evenly between the ranks; its exit status."""
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // ranks)))
    return subprocess.call(torchrun_command(ranks, module, args), env=env)
