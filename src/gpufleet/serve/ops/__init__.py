"""Batched multi-LoRA operators (Punica's SGMV / BGMV) behind one interface, in PyTorch or Triton.

``get_lora_ops(backend)`` returns a ``LoraOps`` whose functions take stacked adapter slots ``a_stack [L, h_in, r]``,
``b_stack [L, r, h_out]``, ``scales [L]`` (alpha/r, fp32) and either one slot per row (BGMV, decode) or contiguous
segments ``seg_indptr [S+1]`` / ``seg_lora [S]`` (SGMV, prefill); slot -1 means no adapter. Shrink returns fp32
``v``; expand adds into ``y`` in place. Triton is imported only when its backend is chosen.

``plan_rows(row_slots, device)`` (Triton only; None for the torch backend) turns one engine step's host list of
slots into a plan whose ``add(y, x, a, b, scales)`` serves every row of a projection in one fused launch.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gpufleet.errors import ServeError
from gpufleet.serve.ops.lora_torch import group_rows, segments_from_indices

__all__ = ["BACKENDS", "LoraOps", "get_lora_ops", "group_rows", "segments_from_indices", "triton_interpreting"]

BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class LoraOps:
    """One backend's operators; every backend has the same signatures and semantics (see ``lora_torch``)."""

    name: str
    bgmv_shrink: Callable[..., torch.Tensor]
    bgmv_expand: Callable[..., torch.Tensor]
    sgmv_shrink: Callable[..., torch.Tensor]
    sgmv_expand: Callable[..., torch.Tensor]
    add_lora: Callable[..., torch.Tensor]
    segments_from_indices: Callable[..., tuple[torch.Tensor, torch.Tensor]] = segments_from_indices
    group_rows: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = group_rows
    plan_rows: Callable[..., Any] | None = None


def _from_module(name: str, module: object) -> LoraOps:
    return LoraOps(
        name=name,
        bgmv_shrink=module.bgmv_shrink,
        bgmv_expand=module.bgmv_expand,
        sgmv_shrink=module.sgmv_shrink,
        sgmv_expand=module.sgmv_expand,
        add_lora=module.add_lora,
        plan_rows=getattr(module, "plan_tiles", None),
    )


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    """True when TRITON_INTERPRET=1: Triton kernels jitted now run on CPU tensors under Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def _triton_ops() -> LoraOps:
    """The Triton backend, refused with a clear message where it cannot run."""
    if not _triton_installed():
        raise ServeError(
            "the triton LoRA backend needs the triton package (pip install triton; Linux x86_64 only); "
            "use --lora-backend torch"
        )
    if not torch.cuda.is_available() and not triton_interpreting():
        raise ServeError(
            "the triton LoRA backend needs a CUDA GPU (no GPU is visible); use the torch backend, or set "
            "TRITON_INTERPRET=1 to run the kernels on CPU under Triton's (slow) interpreter"
        )
    from gpufleet.serve.ops import lora_triton

    return _from_module("triton", lora_triton)


def _by_device(name: str, cpu: LoraOps, cuda: LoraOps) -> LoraOps:
    """Operators that send CUDA tensors to ``cuda`` and any others to ``cpu`` (decided by the first argument)."""

    def pick(op: str) -> Callable[..., torch.Tensor]:
        on_cpu, on_cuda = getattr(cpu, op), getattr(cuda, op)
        return lambda first, *args, **kwargs: (on_cuda if first.is_cuda else on_cpu)(first, *args, **kwargs)

    def plan_rows(row_slots: list[int], device: torch.device) -> Any:
        planner = cuda.plan_rows if torch.device(device).type == "cuda" else cpu.plan_rows
        return planner(row_slots, device) if planner is not None else None

    return LoraOps(
        name=name,
        plan_rows=plan_rows,
        **{op: pick(op) for op in ("bgmv_shrink", "bgmv_expand", "sgmv_shrink", "sgmv_expand", "add_lora")},
    )


def get_lora_ops(backend: str = "auto") -> LoraOps:
    """The operators of ``backend``: "torch", "triton", or "auto".

    "auto" is the torch backend where CUDA or triton is missing; otherwise it runs the Triton kernels on CUDA
    tensors and the torch ones on CPU tensors (a CPU model on a GPU machine keeps working), named "auto".
    """
    if backend not in BACKENDS:
        raise ServeError(f"unknown LoRA backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    from gpufleet.serve.ops import lora_torch

    torch_ops = _from_module("torch", lora_torch)
    if backend == "triton":
        return _triton_ops()
    if backend == "auto" and torch.cuda.is_available() and _triton_installed():
        try:
            return _by_device("auto", torch_ops, _triton_ops())
        except ImportError:  # a broken triton install: serve with the torch kernels rather than not at all
            pass
    return torch_ops
