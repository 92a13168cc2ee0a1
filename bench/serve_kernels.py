"""Batched LoRA operators (add_lora = shrink + expand) against the naive loop-per-adapter baseline.

    python bench/serve_kernels.py                 # CPU fp32 (torch backend); on a GPU also the Triton kernels, fp16
    python bench/serve_kernels.py --quick         # fewer shapes
    python bench/serve_kernels.py --device cuda --dtype bfloat16 --json out.json

Baseline (what a server without SGMV/BGMV does, and Punica's test reference): find each adapter's rows, then one
matmul pair per adapter (``x[rows] @ A @ B``) and a scatter-add back. All columns are measured in the same run on
the same inputs: BGMV rows pick random slots (10% none); SGMV rows come in contiguous segments, one per adapter.
With CUDA, Triton's achieved bandwidth (bytes of x, y read+write, v, and each used adapter's A and B once) is
compared with a device-to-device copy of a 1 GiB tensor.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from gpufleet.serve.ops import get_lora_ops, segments_from_indices

SLOTS = 8


def naive_add_lora(
    y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, idx: torch.Tensor
) -> torch.Tensor:
    """The baseline: for each adapter present, gather its rows, two matmuls, scatter-add into y."""
    for slot in torch.unique(idx).tolist():
        if slot < 0:
            continue
        rows = (idx == slot).nonzero().reshape(-1)
        delta = (x[rows].float() @ a[slot].float()) @ b[slot].float()
        y.index_add_(0, rows, (delta * float(scales[slot])).to(y.dtype))
    return y


def timed(fns: dict[str, Callable[[], object]], device: torch.device, reps: int) -> dict[str, float]:
    """Best milliseconds of each function over ``reps`` rounds, the functions interleaved within a round (so a busy
    shared machine slows all of them alike), after two warm-up rounds; synchronised around each call on CUDA."""
    best = dict.fromkeys(fns, float("inf"))
    for rnd in range(reps + 2):
        for name, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if rnd >= 2:
                best[name] = min(best[name], (time.perf_counter() - start) * 1e3)
    return best


def copy_bandwidth(device: torch.device) -> float:
    """GB/s of a device copy of a 1 GiB tensor (read + write counted)."""
    src = torch.empty(256 * 2**20, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = timed({"copy": lambda: dst.copy_(src)}, device, 10)["copy"]
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def make_inputs(mode: str, rows: int, h: int, rank: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """x, y, stacks, scales and the per-row slot ids (SGMV: grouped into one contiguous run per adapter)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, h, generator=g)
    y = torch.randn(rows, h, generator=g)
    a = torch.randn(SLOTS, h, rank, generator=g) / h**0.5
    b = torch.randn(SLOTS, rank, h, generator=g) / rank**0.5
    idx = torch.randint(0, SLOTS, (rows,), generator=g)
    if mode == "bgmv":
        idx[torch.rand(rows, generator=g) < 0.1] = -1
    else:
        idx = idx.sort().values
    scales = torch.rand(SLOTS, generator=g) + 0.5
    to = {"device": device, "dtype": dtype}
    return x.to(**to), y.to(**to), a.to(**to), b.to(**to), scales.to(device), idx.to(device)


def moved_bytes(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, idx: torch.Tensor) -> int:
    """Bytes an ideal fused shrink+expand moves: x once, y twice, v twice (fp32), A and B of each used slot once."""
    used = int((torch.unique(idx) >= 0).sum())
    rows, h = x.shape
    rank = a.shape[2]
    return (rows * h * 3 + used * (a[0].numel() + b[0].numel())) * x.element_size() + rows * rank * 4 * 2


def run_case(
    mode: str, rows: int, h: int, rank: int, dtype: torch.dtype, device: torch.device, triton_ops, reps: int
) -> dict:
    """One table row: torch backend, naive baseline and (with CUDA) Triton, on the same inputs."""
    x, y, a, b, scales, idx = make_inputs(mode, rows, h, rank, dtype, device)
    torch_ops = get_lora_ops("torch")
    if mode == "bgmv":
        kwargs = {"idx": idx}
    else:
        indptr, lora = segments_from_indices(idx.cpu())
        kwargs = {"seg_indptr": indptr, "seg_lora": lora}
    row = {"op": mode, "rows": rows, "h": h, "rank": rank, "segments": len(torch.unique(idx))}
    fns = {
        "torch_ms": lambda: torch_ops.add_lora(y, x, a, b, scales, **kwargs),
        "naive_ms": lambda: naive_add_lora(y, x, a, b, scales, idx),
    }
    if triton_ops is not None:
        fns["triton_ms"] = lambda: triton_ops.add_lora(y, x, a, b, scales, **kwargs)
    row.update(timed(fns, device, reps))
    if triton_ops is not None:
        row["triton_gbps"] = moved_bytes(x, a, b, idx) / (row["triton_ms"] * 1e-3) / 1e9
    return row


def shapes(quick: bool) -> list[tuple[str, int, int, int]]:
    bgmv_rows = [1, 32] if quick else [1, 8, 32, 128]
    sgmv_rows = [256, 1024] if quick else [256, 1024, 4096]
    hs, ranks = ([2048], [16, 64]) if quick else ([2048, 4096], [16, 64])
    return [("bgmv", n, h, r) for n in bgmv_rows for h in hs for r in ranks] + [
        ("sgmv", n, h, r) for n in sgmv_rows for h in hs for r in ranks
    ]


def print_table(rows: list[dict], copy_gbps: float | None) -> None:
    head = f"{'op':5} {'rows':>5} {'h':>5} {'r':>3} {'adpt':>4} {'torch ms':>9} {'naive ms':>9} {'speedup':>7}"
    if copy_gbps is not None:
        head += f" {'triton ms':>9} {'vs naive':>8} {'GB/s':>7} {'of copy':>7}"
    print(head)
    for r in rows:
        line = (
            f"{r['op']:5} {r['rows']:>5} {r['h']:>5} {r['rank']:>3} {r['segments']:>4} {r['torch_ms']:>9.3f} "
            f"{r['naive_ms']:>9.3f} {r['naive_ms'] / r['torch_ms']:>6.2f}x"
        )
        if copy_gbps is not None:
            line += (
                f" {r['triton_ms']:>9.3f} {r['naive_ms'] / r['triton_ms']:>7.1f}x {r['triton_gbps']:>7.0f} "
                f"{100 * r['triton_gbps'] / copy_gbps:>6.0f}%"
            )
        print(line)
    if copy_gbps is not None:
        print(f"device copy bandwidth: {copy_gbps:.0f} GB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument(
        "--dtype",
        choices=["float32", "float16", "bfloat16"],
        default=None,
        help="default: float32 on CPU, float16 on CUDA",
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    dtype = getattr(torch, args.dtype or ("float16" if cuda else "float32"))
    triton_ops = get_lora_ops("triton") if cuda else None
    print(
        f"device {device} ({torch.cuda.get_device_name(device) if cuda else f'{torch.get_num_threads()} threads'}),"
        f" dtype {str(dtype).removeprefix('torch.')}, {SLOTS} adapter slots, best of {args.reps}"
    )
    rows = [run_case(*shape, dtype, device, triton_ops, args.reps) for shape in shapes(args.quick)]
    copy_gbps = copy_bandwidth(device) if cuda else None
    print_table(rows, copy_gbps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "dtype": str(dtype), "copy_gbps": copy_gbps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
