"""Run a function on N local gloo ranks (torch.multiprocessing) for the sharded-embedding and checkpoint tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed", "gpufleet.meta.embedding", "gpufleet.meta.checkpoint", "pytest"]


def run_ranks(world: int, fn: Callable[..., None], tmp_path: Path, *args: Any, timeout_s: float = 60) -> None:
    """Call ``fn(rank, world, *args)`` on ``world`` gloo ranks; re-raise the first rank's failure here.

    Rendezvous is a FileStore in ``tmp_path`` (no port to race for); ``fn`` must be a module-level function.
    Ranks start from a forkserver that has imported torch once, so a spawn costs well under a second after the
    first instead of one torch import per rank.
    """
    mp.set_forkserver_preload(PRELOAD)
    store = tmp_path / f"store-{uuid.uuid4().hex}"
    mp.start_processes(
        _entry, args=(world, str(store), timeout_s, fn, args), nprocs=world, join=True, start_method="forkserver"
    )


def _entry(rank: int, world: int, store: str, timeout_s: float, fn: Callable[..., None], args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
