"""Batched multi-LoRA operators in plain PyTorch: the CPU serving path and the oracle the Triton kernels are tested on.

Math (row-major): shrink ``v = x @ A[slot]`` (always fp32), expand ``y += scale[slot] * v @ B[slot]`` in place.
Layouts: ``a_stack [L, h_in, r]``, ``b_stack [L, r, h_out]``, ``scales [L]`` fp32; slot -1 means "no adapter".

Strategy (measured on CPU with 1 thread, h=2048, r 16/64, 8-32 slots, batches 1-4096): one matmul pair per run of
rows with the same slot, on views of ``x`` / ``y`` (no copies; fp32 ``y`` takes ``addmm_`` in place). Per-row
indices (BGMV) with more than 16 runs are first stable-sorted by slot (a Python step costs ~25 us, a sort and two
permutation copies less), and so are SGMV calls with many tiny segments. Gathering ``A[idx]`` per row (B*h*r
copied) and one GEMM against every slot (L times the flops) both lost at every batch size measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

from gpufleet.errors import ServeError

# Up to this many runs of rows, one matmul pair per run beats sorting rows by adapter (~25 us per run on CPU).
_MAX_DIRECT_RUNS = 16
# Beyond _MAX_DIRECT_RUNS segments, SGMV still loops over them when they average at least this many rows.
_MIN_MEAN_SEGMENT = 8


# ---------------------------------------------------------------------------------------------------- metadata
def segments_from_indices(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs of equal consecutive slot ids as ``(seg_indptr [S+1], seg_lora [S])`` (int64, on idx's device)."""
    idx = torch.as_tensor(idx).reshape(-1)
    if idx.numel() == 0:
        return torch.zeros(1, dtype=torch.long, device=idx.device), torch.zeros(0, dtype=torch.long, device=idx.device)
    lora, counts = torch.unique_consecutive(idx, return_counts=True)
    indptr = torch.zeros(lora.numel() + 1, dtype=torch.long, device=idx.device)
    torch.cumsum(counts, 0, out=indptr[1:])
    return indptr, lora.long()


def group_rows(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stable-sort rows by slot (Punica sorts its batch by adapter): ``(order, seg_indptr, seg_lora)``.

    ``x[order]`` has contiguous segments; results computed on the sorted rows go back with ``out[order] = res``.
    """
    idx = torch.as_tensor(idx).reshape(-1)
    order = torch.sort(idx, stable=True).indices
    indptr, lora = segments_from_indices(idx[order])
    return order, indptr, lora


# ---------------------------------------------------------------------------------------------------- checks
def check_shrink(x: torch.Tensor, a_stack: torch.Tensor) -> None:
    """Shapes of a shrink: x [T, h_in], a_stack [L, h_in, r]."""
    if x.dim() != 2 or a_stack.dim() != 3:
        raise ServeError(
            f"LoRA shrink wants x [T, h_in] and a_stack [L, h_in, r]; got {tuple(x.shape)} and {tuple(a_stack.shape)}"
        )
    if x.shape[1] != a_stack.shape[1]:
        raise ServeError(f"LoRA shrink: x has {x.shape[1]} features but a_stack expects {a_stack.shape[1]} (h_in)")


def check_expand(y: torch.Tensor, v: torch.Tensor, b_stack: torch.Tensor, scales: torch.Tensor) -> None:
    """Shapes of an expand: y [T, h_out], v [T, r], b_stack [L, r, h_out], scales [L]."""
    if y.dim() != 2 or v.dim() != 2 or b_stack.dim() != 3:
        raise ServeError(
            f"LoRA expand wants y [T, h_out], v [T, r], b_stack [L, r, h_out]; got {tuple(y.shape)}, "
            f"{tuple(v.shape)}, {tuple(b_stack.shape)}"
        )
    if y.shape[0] != v.shape[0] or v.shape[1] != b_stack.shape[1] or y.shape[1] != b_stack.shape[2]:
        raise ServeError(
            f"LoRA expand: shapes do not match: y {tuple(y.shape)}, v {tuple(v.shape)}, b_stack {tuple(b_stack.shape)}"
        )
    if scales.numel() != b_stack.shape[0]:
        raise ServeError(f"LoRA expand: {scales.numel()} scales for {b_stack.shape[0]} slots")


def check_rows(idx: torch.Tensor, rows: int) -> torch.Tensor:
    """idx as a 1-D integer tensor of one slot per row."""
    idx = torch.as_tensor(idx)
    if idx.dim() != 1 or idx.numel() != rows or idx.dtype.is_floating_point:
        raise ServeError(f"LoRA: idx must be {rows} integer slot ids (one per row); got {tuple(idx.shape)} {idx.dtype}")
    return idx


def host_segments(
    seg_indptr: torch.Tensor | Sequence[int], seg_lora: torch.Tensor | Sequence[int], rows: int
) -> tuple[list[int], list[int]]:
    """Segments as Python lists, checked: S+1 non-decreasing offsets within [0, rows], S slot ids."""
    indptr = [int(i) for i in torch.as_tensor(seg_indptr).reshape(-1).tolist()]
    lora = [int(i) for i in torch.as_tensor(seg_lora).reshape(-1).tolist()]
    if len(indptr) != len(lora) + 1:
        raise ServeError(
            f"LoRA: seg_indptr needs S+1 = {len(lora) + 1} offsets for {len(lora)} segments; got {len(indptr)}"
        )
    if indptr[0] < 0 or indptr[-1] > rows or any(b < a for a, b in pairwise(indptr)):
        raise ServeError(f"LoRA: seg_indptr must be non-decreasing offsets within [0, {rows}]; got {indptr[:8]}...")
    return indptr, lora


# ---------------------------------------------------------------------------------------------------- helpers
def _f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.float()


def _shrink_segments(
    x: torch.Tensor, a_stack: torch.Tensor, indptr: list[int], lora: list[int], v: torch.Tensor
) -> torch.Tensor:
    """v[s:e] = x[s:e] @ A[l] for each segment, written into views of v (fp32)."""
    for s, slot in enumerate(lora):
        lo, hi = indptr[s], indptr[s + 1]
        if slot >= 0 and hi > lo:
            torch.mm(_f32(x[lo:hi]), _f32(a_stack[slot]), out=v[lo:hi])
    return v


def _expand_segments(
    y: torch.Tensor, v: torch.Tensor, b_stack: torch.Tensor, indptr: list[int], lora: list[int], scales: list[float]
) -> torch.Tensor:
    """y[s:e] += scale * v[s:e] @ B[l] per segment; fp32 y takes an in-place addmm, others an fp32 delta."""
    for s, slot in enumerate(lora):
        lo, hi = indptr[s], indptr[s + 1]
        if slot < 0 or hi <= lo:
            continue
        if y.dtype == torch.float32 and b_stack.dtype == torch.float32:
            y[lo:hi].addmm_(_f32(v[lo:hi]), b_stack[slot], alpha=scales[slot])
        else:
            y[lo:hi] += torch.mm(_f32(v[lo:hi]), _f32(b_stack[slot])).mul_(scales[slot])
    return y


def _segments_to_rows(indptr: list[int], lora: list[int], rows: int, device: torch.device) -> torch.Tensor:
    """Per-row slot ids of a segment list (-1 outside every segment)."""
    idx = torch.full((rows,), -1, dtype=torch.long)
    lens = torch.tensor([b - a for a, b in pairwise(indptr)], dtype=torch.long)
    idx[indptr[0] : indptr[-1]] = torch.repeat_interleave(torch.tensor(lora, dtype=torch.long), lens)
    return idx.to(device)


@dataclass(frozen=True)
class _Plan:
    """Runs of rows to compute one matmul pair each; ``order`` (when set) permutes rows into those runs first."""

    order: torch.Tensor | None
    indptr: list[int]
    lora: list[int]


def _plan_rows(idx: torch.Tensor) -> _Plan:
    """Loop over the runs of equal ids as they are, or stable-sort rows by slot when there are many runs."""
    indptr, lora = segments_from_indices(idx)
    if len(lora) <= _MAX_DIRECT_RUNS:
        return _Plan(None, indptr.tolist(), lora.tolist())
    order, indptr, lora = group_rows(idx)
    return _Plan(order, indptr.tolist(), lora.tolist())


def _plan_segments(seg_indptr: torch.Tensor, seg_lora: torch.Tensor, rows: int, device: torch.device) -> _Plan:
    """Loop over the segments, unless they are many and tiny: then regroup their rows by slot."""
    indptr, lora = host_segments(seg_indptr, seg_lora, rows)
    count = len(lora)
    if count <= _MAX_DIRECT_RUNS or indptr[-1] - indptr[0] >= _MIN_MEAN_SEGMENT * count:
        return _Plan(None, indptr, lora)
    return _plan_rows(_segments_to_rows(indptr, lora, rows, device))


def _shrink(x: torch.Tensor, a_stack: torch.Tensor, plan: _Plan) -> torch.Tensor:
    v = torch.zeros(x.shape[0], a_stack.shape[2], dtype=torch.float32, device=x.device)
    if plan.order is None:
        return _shrink_segments(x, a_stack, plan.indptr, plan.lora, v)
    _shrink_segments(x[plan.order], a_stack, plan.indptr, plan.lora, v)
    out = torch.empty_like(v)
    out[plan.order] = v
    return out


def _expand(
    y: torch.Tensor, v: torch.Tensor, b_stack: torch.Tensor, plan: _Plan, scales: torch.Tensor | list[float]
) -> torch.Tensor:
    if isinstance(scales, torch.Tensor):
        scales = scales.tolist()
    if plan.order is None:
        return _expand_segments(y, v, b_stack, plan.indptr, plan.lora, scales)
    delta = torch.zeros(y.shape[0], y.shape[1], dtype=torch.float32, device=y.device)
    _expand_segments(delta, v[plan.order], b_stack, plan.indptr, plan.lora, scales)
    if y.dtype == torch.float32:
        return y.index_add_(0, plan.order, delta)
    y[plan.order] += delta  # fp32 sum, one rounding to y's dtype
    return y


@dataclass(frozen=True)
class SegmentPlan:
    """The prompt rows' segments and the slots' scales as host lists, worked out once per engine step: every
    projection of every layer reuses them instead of reading the same small tensors back 7 x layers times."""

    plan: _Plan
    scales: list[float]


def segment_plan(seg_indptr: torch.Tensor, seg_lora: torch.Tensor, rows: int, scales: torch.Tensor) -> SegmentPlan:
    """The per-step plan of ``rows`` prompt rows in segments (checked as :func:`sgmv_shrink` checks them)."""
    return SegmentPlan(_plan_segments(seg_indptr, seg_lora, rows, seg_indptr.device), scales.tolist())


def add_lora_segments_planned(
    y: torch.Tensor, x: torch.Tensor, a_stack: torch.Tensor, b_stack: torch.Tensor, plan: SegmentPlan
) -> torch.Tensor:
    """``add_lora`` over segments with the step's plan: y[s:e] += scale · (x[s:e] @ A[l]) @ B[l]."""
    return _expand(y, _shrink(x, a_stack, plan.plan), b_stack, plan.plan, plan.scales)


# ---------------------------------------------------------------------------------------------------- padded
# Many adapters with few rows each (decode under Distinct / Uniform / Skewed popularity): instead of one matmul
# pair per adapter, lay the rows out slot-major, padded to the busiest slot, and run ONE batched matmul pair over
# the contiguous range of slots in use (views of the stacks, no copy of the weights). Measured on a 2-core CPU,
# 32 rows of 32 adapters at h 512-1376, r 16: 0.4-0.7 ms against 1.6-2.0 ms for the per-adapter loop.
_PADDED_MIN_ADAPTERS = 4
_PADDED_MAX_WASTE = 4  # padded rows (slots in range x busiest slot) at most this many times the real rows


def _padded_pays(idx: torch.Tensor) -> bool:
    """True when the batched padded form beats the per-adapter loop: several adapters, bounded padding."""
    used = idx[idx >= 0]
    if used.numel() == 0:
        return False
    counts = torch.bincount(used - used.min())
    adapters = int((counts > 0).sum())
    return adapters >= _PADDED_MIN_ADAPTERS and counts.numel() * int(counts.max()) <= _PADDED_MAX_WASTE * used.numel()


@dataclass(frozen=True)
class PaddedPlan:
    """The slot-major padded layout of a batch's rows, worked out once per engine step and reused by every
    projection of every layer (the rows' adapters do not change within a step)."""

    rows: torch.Tensor  # rows with an adapter, sorted by slot
    slot: torch.Tensor  # their slot minus ``lo``
    pos: torch.Tensor  # their position within their slot's group
    lo: int
    span: int
    width: int
    dense: bool = False  # row i uses slot lo + i, every slot once: no padding, no scatter (a full Distinct batch)


def padded_plan(idx: torch.Tensor) -> PaddedPlan | None:
    """The padded layout of ``idx``, or None when the per-adapter loop is the better form."""
    if not _padded_pays(idx):
        return None
    rows = (idx >= 0).nonzero().squeeze(1)
    slot = idx[rows]
    lo = int(slot.min())
    order = torch.argsort(slot, stable=True)
    rows, slot = rows[order], slot[order] - lo
    counts = torch.bincount(slot)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(rows.numel(), device=idx.device) - torch.repeat_interleave(starts, counts)
    dense = rows.numel() == idx.numel() == counts.numel() and bool(
        (idx == lo + torch.arange(idx.numel(), device=idx.device)).all()
    )
    return PaddedPlan(rows, slot, pos, lo, counts.numel(), int(counts.max()), dense)


def add_lora_planned(
    y: torch.Tensor,
    x: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: torch.Tensor,
    scales: torch.Tensor,
    plan: PaddedPlan,
) -> torch.Tensor:
    """y[i] += scale · (x[i] @ A[slot]) @ B[slot] through one bmm pair over the slots in use (fp32 inside)."""
    lo, span = plan.lo, plan.span
    if plan.dense:  # the rows are the slots in order: the batched matmuls read and write them in place
        v = torch.bmm(_f32(x).unsqueeze(1), _f32(a_stack[lo : lo + span]))
        v.mul_(_f32(scales[lo : lo + span]).view(-1, 1, 1))
        delta = torch.bmm(v, _f32(b_stack[lo : lo + span])).squeeze(1)
        return y.add_(delta.to(y.dtype))  # no copy when y is fp32
    xp = torch.zeros(span, plan.width, x.shape[1], dtype=torch.float32, device=x.device)
    xp[plan.slot, plan.pos] = _f32(x[plan.rows])
    v = torch.bmm(xp, _f32(a_stack[lo : lo + span]))
    v.mul_(_f32(scales[lo : lo + span]).view(-1, 1, 1))
    delta = torch.bmm(v, _f32(b_stack[lo : lo + span]))[plan.slot, plan.pos]
    if y.dtype == torch.float32:
        return y.index_add_(0, plan.rows, delta)
    y[plan.rows] += delta.to(y.dtype)
    return y


def _add_lora_padded(
    y: torch.Tensor,
    x: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: torch.Tensor,
    scales: torch.Tensor,
    idx: torch.Tensor,
) -> torch.Tensor:
    """The padded form with its layout worked out for this call."""
    plan = padded_plan(idx)
    assert plan is not None
    return add_lora_planned(y, x, a_stack, b_stack, scales, plan)


# ---------------------------------------------------------------------------------------------------- API
def bgmv_shrink(x: torch.Tensor, a_stack: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """v[i] = x[i] @ A[idx[i]] as fp32 [B, r]; rows with idx -1 get zeros."""
    check_shrink(x, a_stack)
    return _shrink(x, a_stack, _plan_rows(check_rows(idx, x.shape[0]).to(x.device)))


def bgmv_expand(
    y: torch.Tensor, v: torch.Tensor, b_stack: torch.Tensor, idx: torch.Tensor, scales: torch.Tensor
) -> torch.Tensor:
    """y[i] += scales[idx[i]] * v[i] @ B[idx[i]] in place (fp32 accumulation); rows with idx -1 are unchanged."""
    check_expand(y, v, b_stack, scales)
    return _expand(y, v, b_stack, _plan_rows(check_rows(idx, y.shape[0]).to(y.device)), scales)


def sgmv_shrink(
    x: torch.Tensor, a_stack: torch.Tensor, seg_indptr: torch.Tensor, seg_lora: torch.Tensor
) -> torch.Tensor:
    """v[s:e] = x[s:e] @ A[seg_lora[k]] for each segment k as fp32 [T, r]; other rows and -1 segments get zeros."""
    check_shrink(x, a_stack)
    return _shrink(x, a_stack, _plan_segments(seg_indptr, seg_lora, x.shape[0], x.device))


def sgmv_expand(
    y: torch.Tensor,
    v: torch.Tensor,
    b_stack: torch.Tensor,
    seg_indptr: torch.Tensor,
    seg_lora: torch.Tensor,
    scales: torch.Tensor,
) -> torch.Tensor:
    """y[s:e] += scales[l] * v[s:e] @ B[l] in place for each segment (l = seg_lora[k]); -1 segments unchanged."""
    check_expand(y, v, b_stack, scales)
    return _expand(y, v, b_stack, _plan_segments(seg_indptr, seg_lora, y.shape[0], y.device), scales)


def lora_form(idx: torch.Tensor | None, seg_indptr: torch.Tensor | None, seg_lora: torch.Tensor | None) -> str:
    """ "rows" (idx given) or "segments" (seg_indptr and seg_lora given); anything else is a ServeError."""
    if idx is not None and seg_indptr is None and seg_lora is None:
        return "rows"
    if idx is None and seg_indptr is not None and seg_lora is not None:
        return "segments"
    raise ServeError("add_lora takes either idx (one slot per row) or both seg_indptr and seg_lora (segments)")


def add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: torch.Tensor,
    scales: torch.Tensor,
    *,
    idx: torch.Tensor | None = None,
    seg_indptr: torch.Tensor | None = None,
    seg_lora: torch.Tensor | None = None,
) -> torch.Tensor:
    """y += scale * (x @ A) @ B per row (idx) or per segment (seg_indptr, seg_lora), in place; returns y.

    The grouping of rows is worked out once and shared by the shrink and the expand.
    """
    check_shrink(x, a_stack)
    if lora_form(idx, seg_indptr, seg_lora) == "rows":
        idx = check_rows(idx, x.shape[0]).to(x.device)
        if _padded_pays(idx):
            check_expand(y, x.new_zeros(x.shape[0], a_stack.shape[2]), b_stack, scales)
            return _add_lora_padded(y, x, a_stack, b_stack, scales, idx)
        plan = _plan_rows(idx)
    else:
        plan = _plan_segments(seg_indptr, seg_lora, x.shape[0], x.device)
    v = _shrink(x, a_stack, plan)
    check_expand(y, v, b_stack, scales)
    return _expand(y, v, b_stack, plan, scales)
