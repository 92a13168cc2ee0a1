"""Timed collectives for sharded meta-learning: an autograd all-to-all and a one-buffer sum all-reduce.

Every collective here records its wall time and payload in a ``CommTimer`` so that training can report
communication separately from compute. With torch.distributed not initialised (or a world of one) the helpers
fall back to local no-ops, so single-process code runs unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

ALL_TO_ALL = "all_to_all"
ALL_TO_ALL_GRAD = "all_to_all_grad"
ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"


@dataclass
class CommTimer:
    """Seconds, bytes sent and calls spent in collectives, per kind ("all_to_all", "all_reduce", ...).

    Bytes are the size of this rank's send buffer (for an all-to-all, including the part it keeps). With
    ``sync_cuda`` a CUDA collective is bracketed by ``torch.cuda.synchronize()`` so that asynchronous NCCL
    calls are timed to completion (this removes overlap, so turn it off for production runs).
    """

    sync_cuda: bool = True
    seconds: dict[str, float] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, seconds: float, nbytes: int) -> None:
        """Record one collective of ``kind`` that took ``seconds`` and sent ``nbytes``."""
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds
        self.bytes[kind] = self.bytes.get(kind, 0) + int(nbytes)
        self.calls[kind] = self.calls.get(kind, 0) + 1

    @contextmanager
    def timed(self, kind: str, tensor: torch.Tensor) -> Iterator[None]:
        """Time the block as one collective of ``kind`` whose send buffer is ``tensor``."""
        sync = self.sync_cuda and tensor.is_cuda
        if sync:
            torch.cuda.synchronize(tensor.device)
        start = time.perf_counter()
        yield
        if sync:
            torch.cuda.synchronize(tensor.device)
        self.add(kind, time.perf_counter() - start, tensor.numel() * tensor.element_size())

    def reset(self) -> None:
        """Forget everything recorded so far (e.g. after warm-up steps)."""
        self.seconds.clear()
        self.bytes.clear()
        self.calls.clear()

    def as_dict(self) -> dict[str, dict[str, float]]:
        """``{kind: {"seconds", "bytes", "calls"}}`` for reports and JSON."""
        return {
            k: {"seconds": self.seconds[k], "bytes": self.bytes[k], "calls": self.calls[k]}
            for k in sorted(self.seconds)
        }

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())


_DEFAULT_TIMER = CommTimer()


def default_timer() -> CommTimer:
    """The process-wide timer used when a caller injects none."""
    return _DEFAULT_TIMER


def world_and_rank(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """``(world size, rank)`` within ``group``; ``(1, 0)`` when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def all_to_all(
    out: torch.Tensor,
    inp: torch.Tensor,
    out_splits: Sequence[int] | None = None,
    in_splits: Sequence[int] | None = None,
    *,
    group: dist.ProcessGroup | None = None,
    timer: CommTimer | None = None,
    kind: str = ALL_TO_ALL,
) -> torch.Tensor:
    """Timed ``dist.all_to_all_single`` (not differentiable; use ``AllToAll`` for vectors that need grads)."""
    timer = _DEFAULT_TIMER if timer is None else timer
    with timer.timed(kind, inp):
        dist.all_to_all_single(out, inp.contiguous(), out_splits, in_splits, group=group)
    return out


class AllToAll(torch.autograd.Function):
    """Differentiable uneven all-to-all along dim 0; backward is the reverse all-to-all with splits swapped.

    ``AllToAll.apply(x, out_splits, in_splits, group, timer)``: row block ``i`` of ``x`` (``in_splits[i]``
    rows) goes to rank ``i``; the result stacks ``out_splits[j]`` rows from each rank ``j``.
    """

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],  # type: ignore[override]
        group: dist.ProcessGroup | None = None,
        timer: CommTimer | None = None,
    ) -> torch.Tensor:
        ctx.splits = (list(out_splits), list(in_splits))
        ctx.group, ctx.timer = group, timer
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        return all_to_all(out, x, out_splits, in_splits, group=group, timer=timer, kind=ALL_TO_ALL)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        grad_in = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        all_to_all(grad_in, grad, in_splits, out_splits, group=ctx.group, timer=ctx.timer, kind=ALL_TO_ALL_GRAD)
        return grad_in, None, None, None, None


def all_reduce_sum_(
    tensors: Sequence[torch.Tensor], *, group: dist.ProcessGroup | None = None, timer: CommTimer | None = None
) -> None:
    """Sum ``tensors`` over all ranks in place, as ONE flattened buffer (one collective per call).

    All tensors must share dtype and device. A no-op with one rank or no process group.
    """
    world, _ = world_and_rank(group)
    if world == 1 or not tensors:
        return
    dtypes = {(t.dtype, t.device) for t in tensors}
    if len(dtypes) > 1:
        raise ValueError(f"all_reduce_sum_ needs one dtype and device, got {sorted(map(str, dtypes))}")
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    timer = _DEFAULT_TIMER if timer is None else timer
    with timer.timed(ALL_REDUCE, flat):
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.detach().copy_(flat[offset : offset + n].view(t.shape))
        offset += n
