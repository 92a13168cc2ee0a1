"""Batched multi-LoRA operators as Triton kernels: SGMV (segment grid, ``tl.dot`` tiles) and BGMV (one row per program).

Same functions and semantics as ``lora_torch``. Shrink accumulates in fp32 and writes fp32 ``v`` (split-K across
programs with ``atomic_add`` when there are too few programs to fill the GPU); expand reads ``y``, adds
``scale * v @ B`` accumulated in fp32 and writes ``y``'s dtype (for fp16/bf16 weights ``v`` is rounded to the weight
dtype before the tensor-core dot, as vLLM does). Masks handle any hidden size and rank; slot -1 exits early.

The engine's path is ``plan_tiles`` + ``add_lora_tiles``: a step's rows are cut on the host, once per step, into
tiles of at most 16 rows of one adapter (from the Python slot list it already has: no read-back from the GPU),
and every projection then runs ONE fused kernel (shrink and expand in the same program, no ``v`` tensor, no
atomics). On a GPU a serving step is bound by host-side launches, not by the LoRA arithmetic: measured on an H200,
the four launches per projection of the separate SGMV (prompts) and BGMV (decodes) calls with their checks and
``torch.zeros`` cost about as much as the base model's whole step.

Kernels are plain functions jitted on first use, once per mode: with ``TRITON_INTERPRET=1`` they run on CPU tensors
under Triton's interpreter (fp32/fp16 only: bf16 is wrong there), otherwise they compile for CUDA. This module
imports triton; ``gpufleet.serve.ops`` imports it only when the Triton backend is asked for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby, pairwise
from typing import Any

import torch
import triton
import triton.language as tl

from gpufleet.errors import ServeError
from gpufleet.serve.ops.lora_torch import (
    check_expand,
    check_rows,
    check_shrink,
    group_rows,
    host_segments,
    lora_form,
    segments_from_indices,
)

__all__ = [
    "TILE_ROWS",
    "TilePlan",
    "add_lora",
    "add_lora_tiles",
    "bgmv_expand",
    "bgmv_shrink",
    "group_rows",
    "interpreting",
    "plan_tiles",
    "segments_from_indices",
    "sgmv_expand",
    "sgmv_shrink",
]


# ---------------------------------------------------------------------------------------------------- kernels
def _sgmv_shrink_kernel(
    x_ptr,
    a_ptr,
    v_ptr,
    indptr_ptr,
    lora_ptr,
    h_in,
    rank,
    r_tiles,
    split_k,
    sx_m,
    sx_k,
    sa_l,
    sa_k,
    sa_r,
    sv_m,
    sv_r,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    ATOMIC: tl.constexpr,
    FP32: tl.constexpr,
):
    """Program (m-tile x r-tile, k-split, segment): v[rows, r-tile] (+)= x[rows, k-split] @ A[slot][k-split, r-tile]."""
    seg = tl.program_id(2)
    slot = tl.load(lora_ptr + seg).to(tl.int64)
    start = tl.load(indptr_ptr + seg).to(tl.int64)
    end = tl.load(indptr_ptr + seg + 1).to(tl.int64)
    row0 = start + (tl.program_id(0) // r_tiles) * BLOCK_M
    if (slot < 0) | (row0 >= end):
        return
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_r = (tl.program_id(0) % r_tiles) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_m = offs_m < end
    mask_r = offs_r < rank
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(tl.program_id(1) * BLOCK_K, h_in, BLOCK_K * split_k):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < h_in
        xt = tl.load(
            x_ptr + offs_m[:, None] * sx_m + offs_k[None, :] * sx_k, mask=mask_m[:, None] & mask_k[None, :], other=0.0
        )
        at = tl.load(
            a_ptr + slot * sa_l + offs_k[:, None] * sa_k + offs_r[None, :] * sa_r,
            mask=mask_k[:, None] & mask_r[None, :],
            other=0.0,
        )
        if FP32:
            acc += tl.dot(xt.to(tl.float32), at.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(xt.to(at.dtype), at)
    v_ptrs = v_ptr + offs_m[:, None] * sv_m + offs_r[None, :] * sv_r
    mask = mask_m[:, None] & mask_r[None, :]
    if ATOMIC:
        tl.atomic_add(v_ptrs, acc, mask=mask)
    else:
        tl.store(v_ptrs, acc, mask=mask)


def _sgmv_expand_kernel(
    v_ptr,
    b_ptr,
    y_ptr,
    indptr_ptr,
    lora_ptr,
    scale_ptr,
    rank,
    h_out,
    sv_m,
    sv_r,
    sb_l,
    sb_r,
    sb_n,
    sy_m,
    sy_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    FP32: tl.constexpr,
):
    """Program (m-tile, n-tile, segment): y[rows, n-tile] += scale * v[rows] @ B[slot][:, n-tile]."""
    seg = tl.program_id(2)
    slot = tl.load(lora_ptr + seg).to(tl.int64)
    start = tl.load(indptr_ptr + seg).to(tl.int64)
    end = tl.load(indptr_ptr + seg + 1).to(tl.int64)
    row0 = start + tl.program_id(0) * BLOCK_M
    if (slot < 0) | (row0 >= end):
        return
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < end
    mask_n = offs_n < h_out
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        mask_r = offs_r < rank
        vt = tl.load(
            v_ptr + offs_m[:, None] * sv_m + offs_r[None, :] * sv_r, mask=mask_m[:, None] & mask_r[None, :], other=0.0
        )
        bt = tl.load(
            b_ptr + slot * sb_l + offs_r[:, None] * sb_r + offs_n[None, :] * sb_n,
            mask=mask_r[:, None] & mask_n[None, :],
            other=0.0,
        )
        if FP32:
            acc += tl.dot(vt.to(tl.float32), bt.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(vt.to(bt.dtype), bt)
    scale = tl.load(scale_ptr + slot).to(tl.float32)
    y_ptrs = y_ptr + offs_m[:, None] * sy_m + offs_n[None, :] * sy_n
    mask = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + scale * acc).to(y_ptr.dtype.element_ty), mask=mask)


def _bgmv_shrink_kernel(
    x_ptr,
    a_ptr,
    v_ptr,
    idx_ptr,
    h_in,
    rank,
    split_k,
    sx_m,
    sx_k,
    sa_l,
    sa_k,
    sa_r,
    sv_m,
    sv_r,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    ATOMIC: tl.constexpr,
):
    """Program (k-split, r-tile, row): a GEMV v[row, r-tile] (+)= x[row, k-split] @ A[idx[row]][k-split, r-tile]."""
    row = tl.program_id(2).to(tl.int64)
    slot = tl.load(idx_ptr + row).to(tl.int64)
    if slot < 0:
        return
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = offs_r < rank
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(tl.program_id(0) * BLOCK_K, h_in, BLOCK_K * split_k):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < h_in
        xk = tl.load(x_ptr + row * sx_m + offs_k * sx_k, mask=mask_k, other=0.0).to(tl.float32)
        at = tl.load(
            a_ptr + slot * sa_l + offs_k[:, None] * sa_k + offs_r[None, :] * sa_r,
            mask=mask_k[:, None] & mask_r[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(xk[:, None] * at, axis=0)
    v_ptrs = v_ptr + row * sv_m + offs_r * sv_r
    if ATOMIC:
        tl.atomic_add(v_ptrs, acc, mask=mask_r)
    else:
        tl.store(v_ptrs, acc, mask=mask_r)


def _bgmv_expand_kernel(
    v_ptr,
    b_ptr,
    y_ptr,
    idx_ptr,
    scale_ptr,
    rank,
    h_out,
    sv_m,
    sv_r,
    sb_l,
    sb_r,
    sb_n,
    sy_m,
    sy_n,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Program (n-tile, row): a GEMV y[row, n-tile] += scale * v[row] @ B[idx[row]][:, n-tile]."""
    row = tl.program_id(1).to(tl.int64)
    slot = tl.load(idx_ptr + row).to(tl.int64)
    if slot < 0:
        return
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < h_out
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        mask_r = offs_r < rank
        vr = tl.load(v_ptr + row * sv_m + offs_r * sv_r, mask=mask_r, other=0.0).to(tl.float32)
        bt = tl.load(
            b_ptr + slot * sb_l + offs_r[:, None] * sb_r + offs_n[None, :] * sb_n,
            mask=mask_r[:, None] & mask_n[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(vr[:, None] * bt, axis=0)
    scale = tl.load(scale_ptr + slot).to(tl.float32)
    y_ptrs = y_ptr + row * sy_m + offs_n * sy_n
    y = tl.load(y_ptrs, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + scale * acc).to(y_ptr.dtype.element_ty), mask=mask_n)


def _tiles_lora_kernel(
    x_ptr,
    a_ptr,
    b_ptr,
    y_ptr,
    tiles_ptr,
    scale_ptr,
    num_tiles,
    h_in,
    rank,
    h_out,
    n_split,
    sx_m,
    sx_k,
    sa_l,
    sa_k,
    sa_r,
    sb_l,
    sb_r,
    sb_n,
    sy_m,
    sy_n,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP32: tl.constexpr,
):
    """Program (tile, n-split): v = x[tile rows] @ A[slot] (whole h_in, fp32), then y[tile rows, n-tiles of this
    split] += scale * v @ B[slot]. Each n-split recomputes the small shrink rather than synchronising on it."""
    t = tl.program_id(0)
    start = tl.load(tiles_ptr + t).to(tl.int64)
    end = tl.load(tiles_ptr + num_tiles + t).to(tl.int64)
    slot = tl.load(tiles_ptr + 2 * num_tiles + t).to(tl.int64)
    if slot < 0:
        return
    offs_m = start + tl.arange(0, BLOCK_M)
    mask_m = offs_m < end
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < rank
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, h_in, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < h_in
        xt = tl.load(
            x_ptr + offs_m[:, None] * sx_m + offs_k[None, :] * sx_k, mask=mask_m[:, None] & mask_k[None, :], other=0.0
        )
        at = tl.load(
            a_ptr + slot * sa_l + offs_k[:, None] * sa_k + offs_r[None, :] * sa_r,
            mask=mask_k[:, None] & mask_r[None, :],
            other=0.0,
        )
        if FP32:
            acc += tl.dot(xt.to(tl.float32), at.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(xt.to(at.dtype), at)
    scale = tl.load(scale_ptr + slot).to(tl.float32)
    for n0 in range(tl.program_id(1) * BLOCK_N, h_out, BLOCK_N * n_split):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < h_out
        bt = tl.load(
            b_ptr + slot * sb_l + offs_r[:, None] * sb_r + offs_n[None, :] * sb_n,
            mask=mask_r[:, None] & mask_n[None, :],
            other=0.0,
        )
        if FP32:  # noqa: SIM108 (a constexpr branch: Triton compiles one side)
            delta = tl.dot(acc, bt.to(tl.float32), input_precision="ieee")
        else:
            delta = tl.dot(acc.to(bt.dtype), bt)
        y_ptrs = y_ptr + offs_m[:, None] * sy_m + offs_n[None, :] * sy_n
        mask = mask_m[:, None] & mask_n[None, :]
        y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptrs, (y + scale * delta).to(y_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------------- launching
_JITTED: dict[tuple[str, bool], Any] = {}
# runtime ints that change from step to step: not specialised on (Triton would compile a variant for 1, for
# multiples of 16 and for the rest, a second or more each, in the middle of serving)
_DO_NOT_SPECIALIZE = {"_tiles_lora_kernel": ("num_tiles", "n_split")}


def interpreting() -> bool:
    """True when TRITON_INTERPRET=1, read the way Triton reads it when it decorates a kernel."""
    return bool(triton.knobs.runtime.interpret)


def _kernel(fn: Callable[..., None]) -> Any:
    """``triton.jit(fn)`` made under the current TRITON_INTERPRET setting (Triton reads it at decoration)."""
    key = (fn.__name__, interpreting())
    if key not in _JITTED:
        _JITTED[key] = triton.jit(fn, do_not_specialize=_DO_NOT_SPECIALIZE.get(fn.__name__, ()))
    return _JITTED[key]


def _pow2(n: int, low: int, high: int) -> int:
    return max(low, min(high, triton.next_power_of_2(max(1, n))))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _target_programs(device: torch.device) -> int:
    """Programs worth having in flight: a couple per SM; few under the interpreter (it runs them one by one)."""
    if device.type != "cuda":
        return 4
    return 2 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _split_k(programs: int, k_tiles: int, device: torch.device) -> int:
    """Split the h_in loop over programs (atomic fp32 adds) when the grid alone is too small for the device."""
    want = -(-_target_programs(device) // max(1, programs))
    return _pow2(min(want, k_tiles), 1, 64)


def _on_device(*tensors: torch.Tensor) -> None:
    """Compiled kernels need CUDA tensors; only the interpreter takes CPU ones."""
    if interpreting():
        return
    for t in tensors:
        if t.device.type != "cuda":
            raise ServeError(
                f"the Triton LoRA backend needs CUDA tensors (got one on {t.device}); use the torch "
                "backend on CPU, or TRITON_INTERPRET=1 to run the kernels under Triton's interpreter"
            )


def _segment_meta(
    seg_indptr: torch.Tensor, seg_lora: torch.Tensor, rows: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Segments on the device, plus the longest segment: exact when they come from the host, else ``rows``."""
    indptr, lora = torch.as_tensor(seg_indptr), torch.as_tensor(seg_lora)
    longest = rows
    if indptr.device.type == "cpu":  # checking costs nothing here; on the GPU it would synchronise
        host, _ = host_segments(indptr, lora, rows)
        longest = max((b - a for a, b in pairwise(host)), default=0)
    elif indptr.numel() != lora.numel() + 1:
        raise ServeError(f"LoRA: seg_indptr needs {lora.numel() + 1} offsets for {lora.numel()} segments")
    return indptr.to(device).contiguous(), lora.to(device).contiguous(), longest


def _block_m(longest: int) -> int:
    return _pow2(longest, 16, 64)


# ---------------------------------------------------------------------------------------------------- SGMV
def sgmv_shrink(
    x: torch.Tensor, a_stack: torch.Tensor, seg_indptr: torch.Tensor, seg_lora: torch.Tensor
) -> torch.Tensor:
    """v[s:e] = x[s:e] @ A[seg_lora[k]] for each segment k as fp32 [T, r]; other rows and -1 segments get zeros."""
    check_shrink(x, a_stack)
    _on_device(x, a_stack)
    return _sgmv_shrink(x, a_stack, *_segment_meta(seg_indptr, seg_lora, x.shape[0], x.device))


def _sgmv_shrink(
    x: torch.Tensor, a_stack: torch.Tensor, indptr: torch.Tensor, lora: torch.Tensor, longest: int
) -> torch.Tensor:
    rows, (_, h_in, rank) = x.shape[0], a_stack.shape
    v = torch.zeros(rows, rank, dtype=torch.float32, device=x.device)
    if rows == 0 or lora.numel() == 0 or longest == 0:
        return v
    block_m, block_k, block_r = _block_m(longest), 64, _pow2(rank, 16, 128)
    m_tiles, r_tiles = -(-longest // block_m), -(-rank // block_r)
    split = _split_k(max(lora.numel(), m_tiles) * r_tiles, -(-h_in // block_k), x.device)
    grid = (m_tiles * r_tiles, split, lora.numel())
    _kernel(_sgmv_shrink_kernel)[grid](
        x,
        a_stack,
        v,
        indptr,
        lora,
        h_in,
        rank,
        r_tiles,
        split,
        *x.stride(),
        *a_stack.stride(),
        *v.stride(),
        BLOCK_M=block_m,
        BLOCK_K=block_k,
        BLOCK_R=block_r,
        ATOMIC=split > 1,
        FP32=a_stack.dtype == torch.float32,
    )
    return v


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
    _on_device(y, v, b_stack, scales)
    return _sgmv_expand(y, v, b_stack, *_segment_meta(seg_indptr, seg_lora, y.shape[0], y.device), scales)


def _sgmv_expand(
    y: torch.Tensor,
    v: torch.Tensor,
    b_stack: torch.Tensor,
    indptr: torch.Tensor,
    lora: torch.Tensor,
    longest: int,
    scales: torch.Tensor,
) -> torch.Tensor:
    rows, (_, rank, h_out) = y.shape[0], b_stack.shape
    if rows == 0 or lora.numel() == 0 or longest == 0:
        return y
    block_m, block_n, block_r = _block_m(longest), 64, _pow2(rank, 16, 64)
    grid = (-(-longest // block_m), -(-h_out // block_n), lora.numel())
    _kernel(_sgmv_expand_kernel)[grid](
        v,
        b_stack,
        y,
        indptr,
        lora,
        scales.to(torch.float32).contiguous(),
        rank,
        h_out,
        *v.stride(),
        *b_stack.stride(),
        *y.stride(),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_R=block_r,
        FP32=b_stack.dtype == torch.float32,
    )
    return y


# ---------------------------------------------------------------------------------------------------- BGMV
def bgmv_shrink(x: torch.Tensor, a_stack: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """v[i] = x[i] @ A[idx[i]] as fp32 [B, r]; rows with idx -1 get zeros."""
    check_shrink(x, a_stack)
    _on_device(x, a_stack)
    idx = check_rows(idx, x.shape[0]).to(x.device).contiguous()
    rows, (_, h_in, rank) = x.shape[0], a_stack.shape
    v = torch.zeros(rows, rank, dtype=torch.float32, device=x.device)
    if rows == 0:
        return v
    block_r = _pow2(rank, 16, 128)
    block_k = _pow2(4096 // block_r, 32, 256)
    r_tiles = -(-rank // block_r)
    split = _split_k(rows * r_tiles, -(-h_in // block_k), x.device)
    _kernel(_bgmv_shrink_kernel)[(split, r_tiles, rows)](
        x,
        a_stack,
        v,
        idx,
        h_in,
        rank,
        split,
        *x.stride(),
        *a_stack.stride(),
        *v.stride(),
        BLOCK_K=block_k,
        BLOCK_R=block_r,
        ATOMIC=split > 1,
    )
    return v


def bgmv_expand(
    y: torch.Tensor, v: torch.Tensor, b_stack: torch.Tensor, idx: torch.Tensor, scales: torch.Tensor
) -> torch.Tensor:
    """y[i] += scales[idx[i]] * v[i] @ B[idx[i]] in place (fp32 accumulation); rows with idx -1 are unchanged."""
    check_expand(y, v, b_stack, scales)
    _on_device(y, v, b_stack, scales)
    idx = check_rows(idx, y.shape[0]).to(y.device).contiguous()
    rows, (_, rank, h_out) = y.shape[0], b_stack.shape
    if rows == 0:
        return y
    block_r = _pow2(rank, 16, 64)
    block_n = _pow2(8192 // block_r, 64, 256)
    _kernel(_bgmv_expand_kernel)[(-(-h_out // block_n), rows)](
        v,
        b_stack,
        y,
        idx,
        scales.to(torch.float32).contiguous(),
        rank,
        h_out,
        *v.stride(),
        *b_stack.stride(),
        *y.stride(),
        BLOCK_N=block_n,
        BLOCK_R=block_r,
    )
    return y


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
    """y += scale * (x @ A) @ B per row (idx) or per segment (seg_indptr, seg_lora), in place; returns y."""
    if lora_form(idx, seg_indptr, seg_lora) == "rows":
        idx = check_rows(idx, x.shape[0]).to(x.device)
        return bgmv_expand(y, bgmv_shrink(x, a_stack, idx), b_stack, idx, scales)
    check_shrink(x, a_stack)
    _on_device(y, x, a_stack, b_stack, scales)
    meta = _segment_meta(seg_indptr, seg_lora, x.shape[0], x.device)  # once for both kernels
    v = _sgmv_shrink(x, a_stack, *meta)
    check_expand(y, v, b_stack, scales)
    return _sgmv_expand(y, v, b_stack, *meta, scales)


# ---------------------------------------------------------------------------------------------------- tiles
#: rows per tile of the fused kernel (the smallest tensor-core tile): a decode row of its own adapter wastes the
#: other 15, which costs nothing measurable next to a launch; longer runs of one adapter are cut into several
TILE_ROWS = 16


@dataclass(frozen=True)
class TilePlan:
    """One engine step's rows as tiles of at most ``TILE_ROWS`` rows of one adapter slot, on the device: row
    ``[0, t]`` first, ``[1, t]`` end, ``[2, t]`` slot (int32 [3, T]). Every projection of every layer reuses it."""

    tiles: torch.Tensor
    count: int
    rows: int

    def add(
        self, y: torch.Tensor, x: torch.Tensor, a_stack: torch.Tensor, b_stack: torch.Tensor, scales: torch.Tensor
    ) -> torch.Tensor:
        """y += scale · (x @ A[slot]) @ B[slot] for every planned row, in place (one kernel)."""
        return add_lora_tiles(y, x, a_stack, b_stack, scales, self)


def plan_tiles(row_slots: Sequence[int], device: torch.device | str) -> TilePlan | None:
    """Tiles of the runs of equal slots in ``row_slots`` (a host list, one slot per row, -1 none); None when no row
    has an adapter. One small host-to-device copy per step; nothing is read back."""
    starts: list[int] = []
    ends: list[int] = []
    slots: list[int] = []
    row = 0
    for slot, run in groupby(row_slots):
        length = sum(1 for _ in run)
        if slot >= 0:
            for lo in range(row, row + length, TILE_ROWS):
                starts.append(lo)
                ends.append(min(lo + TILE_ROWS, row + length))
                slots.append(int(slot))
        row += length
    if not starts:
        return None
    tiles = torch.tensor([starts, ends, slots], dtype=torch.int32).to(device)
    return TilePlan(tiles, len(starts), row)


def add_lora_tiles(
    y: torch.Tensor,
    x: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: torch.Tensor,
    scales: torch.Tensor,
    plan: TilePlan,
) -> torch.Tensor:
    """``add_lora`` over a step's :class:`TilePlan`: shrink and expand fused, one launch; returns y."""
    check_shrink(x, a_stack)
    if y.dim() != 2 or b_stack.dim() != 3 or y.shape[0] != x.shape[0] or y.shape[1] != b_stack.shape[2]:
        raise ServeError(f"LoRA: y {tuple(y.shape)} does not match x {tuple(x.shape)} and B {tuple(b_stack.shape)}")
    if x.shape[0] != plan.rows or b_stack.shape[:2] != (a_stack.shape[0], a_stack.shape[2]):
        raise ServeError(
            f"LoRA: the step's tile plan covers {plan.rows} rows (got {x.shape[0]}) or A and B stacks differ"
        )
    _on_device(y, x, a_stack, b_stack, scales)
    _, h_in, rank = a_stack.shape
    h_out = b_stack.shape[2]
    block_r = _pow2(rank, 16, 1024)
    block_k = _pow2(8192 // block_r, 16, 64)
    block_n = 64
    n_split = max(1, min(-(-h_out // block_n), -(-_target_programs(x.device) // plan.count)))
    _kernel(_tiles_lora_kernel)[(plan.count, n_split)](
        x,
        a_stack,
        b_stack,
        y,
        plan.tiles,
        scales if scales.dtype == torch.float32 else scales.float(),
        plan.count,
        h_in,
        rank,
        h_out,
        n_split,
        *x.stride(),
        *a_stack.stride(),
        *b_stack.stride(),
        *y.stride(),
        BLOCK_M=TILE_ROWS,
        BLOCK_K=block_k,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        FP32=a_stack.dtype == torch.float32,
    )
    return y
