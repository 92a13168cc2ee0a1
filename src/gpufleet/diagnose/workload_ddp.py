"""Torch-DDP shapes of the diagnosis workload: jobs the detector was not designed around.

``--family lm-ddp`` trains the workload's transformer under ``DistributedDataParallel``; ``cnn-ddp`` a small CNN
(BatchNorm buffers broadcast every forward) fed by a DataLoader with or without ``--workers``; ``lm-accum``
accumulates ``--accum`` micro-batches per step with ``no_sync``. Every fault of :mod:`gpufleet.diagnose.faults` acts
here too. Unlike the ``lm`` family these loops carry no ``gpufleet::`` sections, as most user code does not: the
healthy ranks wait inside the autograd engine (DDP's reducer), where no trace event shows it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function
from torch.utils.data import DataLoader, Dataset

from gpufleet.diagnose import faults
from gpufleet.diagnose.faults import Fault
from gpufleet.diagnose.workload_parts import (
    Hung,
    MomentumSGD,
    SlowCollate,
    SyntheticTokens,
    TinyLM,
    arm_hang,
    rank_profiler,
    start_rank,
    throttled,
)

__all__ = ["SmallCNN", "SyntheticImages", "Throttled", "train_ddp"]

#: the slow-collective fault's DDP comm hook shows as this annotation around each bucket's all-reduce
HOOK = "gpufleet::allreduce_hook"


class SyntheticImages(Dataset):
    """Random 3x32x32 images with one of 10 labels, reproducible per (seed, index)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.randn(3, 32, 32, generator=g), torch.randint(10, (), generator=g)


class Throttled(nn.Module):
    """A layer on a device that may be throttled: ``factor`` extra of its time, forward and backward (0: healthy)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer, self.factor = layer, 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return throttled(self.layer, x, self.factor)


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(), nn.MaxPool2d(2))


class SmallCNN(nn.Module):
    """Two conv-BatchNorm-ReLU-pool blocks and a linear head; ``syncs`` needless ``.item()`` after each block.

    Each block and the head run on a device that may be throttled: a slow device slows every op, not only the convs.
    """

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Throttled(_conv_block(3, width)), Throttled(_conv_block(width, 2 * width))])
        self.head = Throttled(nn.Linear(2 * width * 8 * 8, 10))
        self.syncs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
            for _ in range(self.syncs):
                torch.isfinite(x).all().item()  # a debug check left in: a host-device sync per block
        return self.head(x.flatten(1))


def _model(args: argparse.Namespace, fault: Fault, rank: int) -> tuple[nn.Module, Dataset, Any]:
    """The family's model with this rank's compute faults, its data set and the loss on a batch."""
    torch.manual_seed(args.seed)
    total = (args.wait + args.warmup + args.steps) * max(args.accum if args.family == "lm-accum" else 1, 1)
    if args.family == "cnn-ddp":
        model: nn.Module = SmallCNN()
        layers, knob = [m for m in model.modules() if isinstance(m, Throttled)], "factor"
        if fault.on(rank, "sync"):
            model.syncs = round(fault.magnitude)
        data: Dataset = SyntheticImages(args.batch * total, args.seed * 7919 + rank)

        def loss_fn(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(m(x), y)
    else:
        model = TinyLM(args.vocab, args.hidden, args.layers, args.heads, args.seq)
        layers, knob = list(model.blocks), "throttle"
        if fault.on(rank, "sync"):
            for blk in model.blocks:
                blk.syncs = round(fault.magnitude)
        data = SyntheticTokens(args.batch * total, args.seq, args.vocab, args.seed * 7919 + rank)

        def loss_fn(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(m(x).reshape(-1, args.vocab), y.reshape(-1))

    if fault.on(rank, "slow-rank"):
        for layer in layers:
            setattr(layer, knob, fault.magnitude)  # Block.throttle or Throttled.factor
    return model, data, loss_fn


class _HookState:
    """The slow-collective comm hook's state: this rank's delay per step, spread over the buckets of the last step."""

    def __init__(self, delay: float, world: int) -> None:
        self.delay, self.world, self.calls, self.last_calls = delay, world, 0, 1

    def new_step(self) -> None:
        self.last_calls, self.calls = max(self.calls, 1), 0


def _delayed_allreduce(state, bucket):  # DDP refuses a hook whose annotations it cannot check
    """DDP comm hook: average the bucket with one all-reduce, after this rank's delay share (0 on healthy ranks)."""
    state.calls += 1
    with record_function(HOOK):
        faults.sleep(state.delay / state.last_calls)  # a rank whose communication path is slow reaches it late
        tensor = bucket.buffer().div_(state.world)
        fut = dist.all_reduce(tensor, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def train_ddp(args: argparse.Namespace) -> int:
    """Run a DDP family on this rank (see the module docstring); returns the process exit status."""
    torch.set_num_threads(1)
    run = start_rank(args)
    fault, rank, world, dev, out = run.fault, run.rank, run.world, run.dev, run.out
    total, hang_step, pause_steps = run.total, run.hang_step, run.pause_steps
    model, data, loss_fn = _model(args, fault, rank)
    ddp = DistributedDataParallel(model.to(dev), bucket_cap_mb=args.bucket_mb)
    hook = _HookState(fault.magnitude if fault.on(rank, "slow-collective") else 0.0, world)
    if fault.kind == "slow-collective":
        ddp.register_comm_hook(hook, _delayed_allreduce)
    opt = MomentumSGD([p for p in ddp.parameters() if p.requires_grad])
    delay = fault.magnitude * max(args.workers, 1) if fault.on(rank, "slow-data") else 0.0  # per batch per worker
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers, collate_fn=SlowCollate(delay))
    micro = args.accum if args.family == "lm-accum" else 1
    arm_hang(args, fault)
    prof = rank_profiler(args, run)
    step_s: list[float] = []
    prof.start()
    try:
        it = iter(loader)
        for i in range(total):
            t0 = time.perf_counter()
            hook.new_step()
            opt.zero_grad()
            for k in range(micro):
                if fault.on(rank, "host-before") and k == 0 and args.family != "cnn-ddp":
                    faults.python_pause(fault.magnitude)  # un-annotated input work before the loader
                x, y = next(it)
                if fault.on(rank, "host-before") and k == 0 and args.family == "cnn-ddp":
                    faults.python_pause(fault.magnitude)  # un-annotated augmentation of the batch it loaded
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                sync = contextlib.nullcontext() if k == micro - 1 else ddp.no_sync()
                with sync:
                    loss = loss_fn(ddp, x, y) / micro
                    if fault.on(rank, "python-pause") and i in pause_steps and k == 0:
                        faults.python_pause(fault.magnitude)
                    if fault.on(rank, "hang") and i == hang_step:
                        faults.sleep(fault.magnitude)  # stuck before backward: the others wait in the reducer
                        raise Hung
                    loss.backward()
            opt.step()
            if fault.on(rank, "host-after"):
                faults.python_pause(fault.magnitude)
            step_s.append(time.perf_counter() - t0)
            prof.step()
    except Hung:
        pass
    except (RuntimeError, dist.DistError) as e:
        if fault.kind != "hang":
            raise
        print(f"rank {rank}: collective failed at step {len(step_s)}, as the hang fault intends: {e}", file=sys.stderr)
    finally:
        prof.stop()
    (out / f"steps-rank-{rank}.json").write_text(json.dumps({"rank": rank, "step_s": step_s}) + "\n")
    if fault.kind == "hang":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.barrier()
    dist.destroy_process_group()
    return 0
