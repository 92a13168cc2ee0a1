"""The parts every shape of the diagnosis workload shares: data, models with a throttled device, the optimiser,
and the run's plumbing (process group, profiler, trace export, ground truth).

:mod:`gpufleet.diagnose.workload` (the ``lm`` family, the command line and the launcher) and
:mod:`gpufleet.diagnose.workload_ddp` (the torch-DDP families) build on it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import Dataset, default_collate

from gpufleet.diagnose import faults
from gpufleet.diagnose.faults import Fault, parse_fault
from gpufleet.errors import ConfigError

__all__ = [
    "Block",
    "Hung",
    "MomentumSGD",
    "Profile",
    "SlowCollate",
    "SyntheticTokens",
    "TinyLM",
    "export_trace",
    "free_port",
    "ground_truth",
    "init_dist",
    "throttled",
]


# ---- data ---------------------------------------------------------------------------------------------------------
class SyntheticTokens(Dataset):
    """Random token sequences, reproducible per (seed, rank, index); item = (inputs, next-token targets)."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int) -> None:
        self.n, self.seq, self.vocab, self.seed = n, seq, vocab, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        t = torch.randint(self.vocab, (self.seq + 1,), generator=g)
        return t[:-1], t[1:]


class SlowCollate:
    """``default_collate`` that first waits ``delay`` seconds: the slow-data fault (a slow read or decode)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def __call__(self, batch: list[Any]) -> Any:
        faults.sleep(self.delay)
        return default_collate(batch)


# ---- model --------------------------------------------------------------------------------------------------------
_DEVICE_OPS: Any = None
_now = time.perf_counter  # the clock a throttled layer times itself with (a test may swap it)


def _block(x: torch.Tensor, seconds: float) -> torch.Tensor:
    """Body of ``gpufleet::device_wait``: wait ``seconds`` (none on a healthy rank) without using the CPU."""
    faults.sleep(seconds)
    return x.new_empty(0)


def _throttle_op() -> Any:
    """The ``gpufleet::device_wait`` op (registered once per process): blocks for the seconds it is given.

    It is a real dispatcher op, so the profiler records it as a ``cpu_op`` inside the layer that called it, exactly
    where a throttled GPU's longer kernels would keep the host waiting for them.
    """
    global _DEVICE_OPS
    if _DEVICE_OPS is None:
        lib = torch.library.Library("gpufleet", "DEF")
        lib.define("device_wait(Tensor x, float seconds) -> Tensor")
        lib.impl("device_wait", _block, "CompositeExplicitAutograd")
        _DEVICE_OPS = lib  # keep the library alive: dropping it unregisters the op
    return torch.ops.gpufleet.device_wait


class _LayerClock:
    """Start times of one wrapped layer call, forward and backward, shared by its enter/exit autograd nodes."""

    __slots__ = ("backward_s", "factor", "forward_s")

    def __init__(self, factor: float) -> None:
        self.factor, self.forward_s, self.backward_s = factor, 0.0, 0.0

    def stall(self, since: float, x: torch.Tensor) -> None:
        """Block for ``factor`` times the seconds since ``since``: the layer ran (1 + factor) times as long."""
        _throttle_op()(x.detach(), self.factor * (_now() - since))


class _EnterLayer(torch.autograd.Function):
    """Identity before a throttled layer: notes its forward start; in backward, stalls for the layer's backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: _LayerClock) -> torch.Tensor:
        ctx.clock = clock
        clock.forward_s = _now()
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.clock.stall(ctx.clock.backward_s, grad)
        return grad, None


class _ExitLayer(torch.autograd.Function):
    """Identity after a throttled layer: stalls for its forward; in backward, notes the backward start."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, clock: _LayerClock) -> torch.Tensor:
        ctx.clock = clock
        clock.stall(clock.forward_s, y)
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.clock.backward_s = _now()
        return grad, None


def throttled(layer: nn.Module, x: torch.Tensor, factor: float) -> torch.Tensor:
    """``layer(x)`` on a device throttled by ``factor``: forward and backward each take ``1 + factor`` times as long.

    The slow-rank fault. A clock-capped or overheating GPU runs the same kernels slower while its host waits; it
    does not take CPU from the other ranks' hosts. Extra matmul work would, on a machine where 4 ranks share 2
    cores, and the scheduler's noise would then drown the fault. So the extra time is spent blocked, in a
    ``gpufleet::device_wait`` op that every rank runs (0 s on a healthy one): the slow rank calls the very same
    ops as the others, only for longer.
    """
    clock = _LayerClock(factor)
    return _ExitLayer.apply(layer(_EnterLayer.apply(x, clock)), clock)


class Block(nn.Module):
    """A pre-norm transformer block whose linears can run on a throttled device and which can sync needlessly."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.throttle = 0.0  # extra fraction of every linear's time, forward and backward: the slow-rank fault
        self.syncs = 0  # needless .item() calls per forward, set by the sync fault

    def _lin(self, lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return throttled(lin, x, self.throttle)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, s, d = h.shape
        x = self.ln1(h).reshape(b * s, d)
        q, k, v = self._lin(self.qkv, x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b * s, d)
        h = h + self._lin(self.proj, a).reshape(b, s, d)
        x = self.ln2(h).reshape(b * s, d)
        h = h + self._lin(self.fc2, F.gelu(self._lin(self.fc1, x))).reshape(b, s, d)
        for _ in range(self.syncs):
            torch.isfinite(h).all().item()  # a host-device sync nobody needs (a "debug check" left in)
            if h.is_cuda:
                torch.cuda.synchronize()
        return h


class TinyLM(nn.Module):
    """A GPT-style language model small enough to train on CPU in tens of milliseconds per step."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.ln(h))


class MomentumSGD:
    """SGD with momentum in three foreach ops; ``torch.optim`` would import torch._dynamo, 3 s per process."""

    def __init__(self, params: list[nn.Parameter], lr: float = 0.05, momentum: float = 0.9) -> None:
        self.params, self.lr, self.momentum = params, lr, momentum
        self.bufs = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def zero_grad(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_zero_(grads)

    @torch.no_grad()
    def step(self) -> None:
        torch._foreach_mul_(self.bufs, self.momentum)
        torch._foreach_add_(self.bufs, [p.grad for p in self.params])
        torch._foreach_add_(self.params, self.bufs, alpha=-self.lr)


# ---- the run's plumbing -----------------------------------------------------------------------------------------
def init_dist(device: str, timeout: float) -> tuple[int, int, torch.device]:
    """Join the process group (gloo on CPU, NCCL on GPU); a lone process without torchrun is a world of one."""
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local)
    dev = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    kw: dict[str, Any] = {"backend": "nccl" if use_cuda else "gloo", "timeout": timedelta(seconds=timeout)}
    if "RANK" not in os.environ:  # not under torchrun
        kw.update(init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    dist.init_process_group(**kw)
    return dist.get_rank(), dist.get_world_size(), dev


class Profile(profile):
    """``torch.profiler.profile`` that does not import torch._inductor (3 s per rank) only to read a CUDA-graph flag.

    torch asks ``hasattr(torch, "_inductor")``, which imports inductor and dynamo lazily; this workload compiles
    nothing, so the flag keeps its default (False) and start-up stays short.
    """

    def prepare_trace(self) -> None:
        lazy = getattr(torch, "_lazy_modules", None)
        if "torch._inductor" in sys.modules or not isinstance(lazy, set) or "_inductor" not in lazy:
            super().prepare_trace()
            return
        lazy.discard("_inductor")
        try:
            super().prepare_trace()
        finally:
            lazy.add("_inductor")


def export_trace(prof: profile, path: Path) -> None:
    """Write the profiler's Chrome trace gzipped in one go (torch gzips it line by line: seconds per rank)."""
    if path.suffix != ".gz":
        prof.export_chrome_trace(str(path))
        return
    tmp = path.with_name(path.name.removesuffix(".gz"))  # also the trace's traceName
    prof.export_chrome_trace(str(tmp))
    path.write_bytes(gzip.compress(tmp.read_bytes(), compresslevel=4))
    tmp.unlink()


class Hung(Exception):
    """Raised on the hanging rank after its stall, to stop training and flush its trace."""


def ground_truth(args: argparse.Namespace, fault: Fault, world: int, pauses: list[int], hang: int) -> dict[str, Any]:
    """The content of ``fault.json``: the fault, where it acts, and the run's shape."""
    first = args.wait + args.warmup
    total = first + args.steps
    acts = {"python-pause": pauses, "hang": [hang]}.get(fault.kind, list(range(total)))
    return {
        **fault.to_dict(),
        "family": args.family,
        "seed": args.seed,
        "world_size": world,
        "backend": dist.get_backend(),
        "steps": args.steps,
        "profiled_steps": list(range(first, total)),
        "affected_steps": [s for s in acts if first <= s < total] if fault.rank is not None else [],
        "timeout_s": args.hang_timeout if fault.kind == "hang" else args.timeout,
        "magnitude_means": faults.FAULTS[fault.kind][2] if fault.kind in faults.FAULTS else "no fault",
    }


@dataclass(frozen=True)
class RankRun:
    """What every family's training loop starts from on one rank: its fault, place in the group and step plan."""

    fault: Fault
    rank: int
    world: int
    dev: torch.device
    total: int  # steps run: wait + warmup + profiled
    hang_step: int
    pause_steps: list[int]
    out: Path


def start_rank(args: argparse.Namespace) -> RankRun:
    """Join the process group, resolve the fault for this world size, and (rank 0) write ``fault.json``.

    A hang on NCCL needs blocking waits so that the stuck collective raises on timeout instead of aborting the
    process before its trace is written; this is set before the group is made, for every family.
    """
    fault = parse_fault(args.fault)
    if fault.kind == "hang" and (args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())):
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # wait() raises on timeout instead of aborting
    rank, world, dev = init_dist(args.device, args.timeout)
    fault = parse_fault(args.fault, world)
    if fault.kind == "hang" and fault.magnitude < 0:
        fault = Fault("hang", fault.rank, args.hang_timeout + 2.0)
    total = args.wait + args.warmup + args.steps
    hang_step = args.hang_step if args.hang_step is not None else args.wait + args.warmup + args.steps // 2
    pause_steps = [i for i in range(total) if (i + 1) % args.pause_every == 0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        truth = ground_truth(args, fault, world, pause_steps, hang_step)
        (out / "fault.json").write_text(json.dumps(truth, indent=2) + "\n")
    return RankRun(fault, rank, world, dev, total, hang_step, pause_steps, out)


def arm_hang(args: argparse.Namespace, fault: Fault) -> None:
    """For a hang fault: start together, then let the stuck collective time out after ``--hang-timeout``."""
    if fault.kind != "hang":
        return
    dist.barrier()
    if hasattr(dist.distributed_c10d, "_set_pg_timeout"):
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=args.hang_timeout))


def rank_profiler(args: argparse.Namespace, run: RankRun) -> Profile:
    """The profiler of one rank: CPU (and CUDA on a GPU) over the profiled steps, exported to ``rank-{r}.json.gz``."""
    trace_path = run.out / f"rank-{run.rank}.json.gz"
    return Profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.dev.type == "cuda" else []),
        schedule=schedule(wait=args.wait, warmup=args.warmup, active=args.steps, repeat=1),
        on_trace_ready=lambda p: export_trace(p, trace_path),
        record_shapes=False,
        with_stack=False,
    )


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
