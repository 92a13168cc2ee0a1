"""Where a serving step's time goes on a GPU: one full batch of Distinct requests decoding, timed per step.

    python bench/serve_step_profile.py --base wide-llama-random            # CUDA, fp16
    python bench/serve_step_profile.py --profile out.txt                   # also torch.profiler's op tables

Rows, measured in the same process on the same requests (every row a fresh engine with the batch admitted and its
prompts prefilled, then ``--steps`` decode steps, each followed by a device synchronisation):
- ``base_only``: no adapter (the ceiling);
- ``fused``: the engine's Triton path (rows planned once per step as tiles, one fused kernel per projection);
- ``sgmv+bgmv``: the separate shrink and expand kernels per projection, prompts and decodes apart (before);
- ``torch ops``: the PyTorch operators on the GPU.
Columns: wall ms per decode step; of it, building the step's tensors (``_build``), the forward's host time before
the device is waited for, and the device time of the forward (CUDA events). Then one projection's LoRA call
alone, and the cost of loading an adapter into a slot.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from gpufleet.serve.adapters import AdapterCache, AdapterStore
from gpufleet.serve.bench import WorkloadConfig, make_workload, random_adapters
from gpufleet.serve.continuous_batching import Engine, EngineConfig
from gpufleet.serve.ops import get_lora_ops
from gpufleet.serve.protocol import SamplingParams
from gpufleet.serve.weights import load_model

DEVICE = "cuda"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class _Timer:
    """CUDA events on a GPU; wall time elsewhere (the CPU smoke run of this script)."""

    def __init__(self) -> None:
        self.cuda = DEVICE == "cuda"
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def begin(self) -> None:
        if self.cuda:
            self.start.record()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.end.record()
        self.t1 = time.perf_counter()

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3 if self.cuda else self.t1 - self.t0


def _engine(model, store, variant: str, batch: int) -> Engine:
    config = EngineConfig(max_batch=batch, adapter_slots=batch, max_rank=16, kv_blocks=batch * 24)
    engine = Engine(model, store, config)
    if variant == "sgmv+bgmv":
        engine.ops = dataclasses.replace(engine.ops, plan_rows=None)
    elif variant == "torch ops":
        engine.ops = get_lora_ops("torch")
    return engine


def _fill(engine: Engine, requests, use_adapters: bool) -> None:
    for r in requests:
        engine.add_request(
            r.id, r.prompt, r.adapter if use_adapters else None, SamplingParams(max_tokens=10_000, ignore_eos=True)
        )
    engine.step()  # admits and prefills the whole batch
    _sync()


def measure(engine: Engine, steps: int) -> dict[str, float]:
    """Per decode step: wall, _build, forward host time, forward device time (ms, medians)."""
    walls, builds, hosts, devices = [], [], [], []
    for _ in range(steps):
        engine._ensure_decode_room()  # what step() does first: a block for every row's next token
        decodes = sorted(engine.running, key=lambda r: r.slot)
        t0 = time.perf_counter()
        batch, lora = engine._build([], decodes)
        t1 = time.perf_counter()
        timer = _Timer()
        timer.begin()
        engine.model(batch, engine.kv, lora)
        timer.stop()
        t2 = time.perf_counter()
        _sync()
        builds.append(t1 - t0)
        hosts.append(t2 - t1)
        devices.append(timer.seconds())
        _sync()
        t3 = time.perf_counter()
        engine.step()
        _sync()
        walls.append(time.perf_counter() - t3)

    def med(xs: list[float]) -> float:
        return 1e3 * sorted(xs)[len(xs) // 2]

    return {"step": med(walls), "build": med(builds), "fwd_host": med(hosts), "fwd_device": med(devices)}


def projection_call(model, engine: Engine, variant: str, reps: int = 200) -> tuple[float, float]:
    """Host and device microseconds of one LoRA call on q_proj's stacks for the engine's current decode batch."""
    engine._ensure_decode_room()
    decodes = sorted(engine.running, key=lambda r: r.slot)
    _, lora = engine._build([], decodes)
    a, b = engine.adapters.stacks(0, "q_proj")
    h = model.config.hidden_size
    x = torch.randn(len(decodes), h, dtype=a.dtype, device=a.device)
    y = torch.zeros(len(decodes), b.shape[2], dtype=a.dtype, device=a.device)

    def call() -> None:
        if lora.step_plan is not None:
            lora.step_plan.add(y, x, a, b, lora.scales)
        else:
            lora.ops.add_lora(y, x, a, b, lora.scales, idx=lora.row_slots)

    call()
    _sync()
    timer = _Timer()
    timer.begin()
    for _ in range(reps):
        call()
    timer.stop()
    host = (timer.t1 - timer.t0) / reps
    _sync()
    return 1e6 * host, 1e6 * timer.seconds() / reps


def load_cost(model, store, names: list[str]) -> float:
    """Milliseconds to bring an adapter into a slot (evicting another), synchronised."""
    cache = AdapterCache(store, 8, 16, next(model.parameters()).dtype, DEVICE)
    for name in names[:8]:
        cache.acquire(name)
        cache.release(name)
    _sync()
    t0 = time.perf_counter()
    for name in names[8:]:
        cache.acquire(name)
        cache.release(name)
    _sync()
    return 1e3 * (time.perf_counter() - t0) / len(names[8:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="wide-llama-random")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variants", default="base_only,fused,sgmv+bgmv,torch ops")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (no Triton rows)")
    ap.add_argument("--profile", type=Path, help="write torch.profiler op tables of one step per variant here")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    model = load_model(args.base, dtype=getattr(torch, args.dtype), device=DEVICE)
    requests = make_workload(WorkloadConfig(requests=args.batch, batch=args.batch), "distinct", model.config.vocab_size)
    names = sorted({r.adapter for r in requests})
    store = AdapterStore(model.config)
    for adapter in random_adapters(model.config, names, 16):
        store.add(adapter)
    variants = [v for v in args.variants.split(",") if v]
    rows, profiles = [], []
    for variant in variants:
        engine = _engine(model, store, variant, args.batch)
        _fill(engine, requests, variant != "base_only")
        measure(engine, 3)  # warm: kernels compiled, allocator filled
        result = measure(engine, args.steps)
        host_us, device_us = projection_call(model, engine, variant) if variant != "base_only" else (0.0, 0.0)
        rows.append((variant, result, host_us, device_us))
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
            with profile(activities=activities) as prof:
                engine.step()
                _sync()
            table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=18, max_name_column_width=40)
            profiles.append(f"== {variant}\n{table}")
    print(
        f"{args.base} {args.dtype} on {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}, "
        f"{args.batch} Distinct requests decoding, "
        f"median of {args.steps} steps"
    )
    print(
        f"{'variant':12} {'step ms':>8} {'build ms':>9} {'fwd host ms':>12} {'fwd GPU ms':>11} {'÷ base':>7} "
        f"{'LoRA call host us':>18} {'GPU us':>7}"
    )
    base = rows[0][1]["step"]
    for variant, r, host_us, device_us in rows:
        print(
            f"{variant:12} {r['step']:>8.2f} {r['build']:>9.2f} {r['fwd_host']:>12.2f} {r['fwd_device']:>11.2f} "
            f"{r['step'] / base:>6.2f}x {host_us:>18.1f} {device_us:>7.1f}"
        )
    extra = [f"lora-x{i}" for i in range(24)]
    for adapter in random_adapters(model.config, extra, 16, seed=7):
        store.add(adapter)
    print(f"adapter load into a slot (evicting one): {load_cost(model, store, extra):.2f} ms")
    if args.profile:
        args.profile.write_text("\n\n".join(profiles))


if __name__ == "__main__":
    main()
