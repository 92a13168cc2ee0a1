"""StepMonitor's overhead on the diagnosis test workload: step time with and without the monitor, and the cost of
one empty section. Prints tables; run with ``python bench/diagnose_monitor_overhead.py [--nproc 4 --repeats 3]``.

The A/B runs are interleaved (off, on, off, on, ...) with the same seed and no profiler; a run's step time is the
median over steps of the slowest rank's step. The microbenchmark times ``with mon.section(...)`` on an empty body.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from gpufleet.diagnose.monitor import StepMonitor
from gpufleet.diagnose.workload import run_workload

SECTIONS_PER_STEP = 5  # data, forward, backward, allreduce, optimizer


def step_time(out: Path, nproc: int, skip: int) -> tuple[float, float]:
    """Median over steps (after ``skip``) of the slowest rank's step time, and the mean time per step spent
    inside ``mon.step()`` (gathers and writes included; 0 without the monitor), in seconds."""
    runs = [json.loads((out / f"steps-rank-{r}.json").read_text()) for r in range(nproc)]
    step = float(np.median(np.max(np.array([d["step_s"][skip:] for d in runs]), axis=0)))
    inside = float(np.mean([np.mean(d["monitor_step_s"]) for d in runs])) if "monitor_step_s" in runs[0] else 0.0
    return step, inside


def ab_runs(nproc: int, steps: int, repeats: int, every: int) -> tuple[list[float], list[float], list[float]]:
    """Interleaved runs without and with the monitor: step times off, step times on, time inside mon.step()."""
    off: list[float] = []
    on: list[float] = []
    inside: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for monitored in (False, True):
                out = Path(tmp) / f"{i}-{int(monitored)}"
                extra = ["--no-profile", "--wait", "0", "--warmup", "0"]
                if monitored:
                    extra += ["--timings", str(out / "timings.csv"), "--timings-every", str(every)]
                run_workload(out, nproc=nproc, steps=steps, seed=0, extra=extra)
                step, mon = step_time(out, nproc, skip=3)
                (on if monitored else off).append(step)
                if monitored:
                    inside.append(mon)
    return off, on, inside


def section_cost_us(device: str, n: int = 200_000) -> tuple[float, float]:
    """Cost (µs) of one empty ``with mon.section(...)`` and of one ``mon.step()`` with five sections."""
    mon = StepMonitor(every=10**9, device=device)
    sec = "forward"
    for _ in range(1000):
        with mon.section(sec):
            pass
    t = time.perf_counter()
    for _ in range(n):
        with mon.section(sec):
            pass
    per_section = (time.perf_counter() - t) / n * 1e6
    names = ["data", "forward", "backward", "allreduce", "optimizer"]
    m = n // 20
    t = time.perf_counter()
    for _ in range(m):
        for s in names:
            with mon.section(s):
                pass
        mon.step()
    per_step = (time.perf_counter() - t) / m * 1e6 - SECTIONS_PER_STEP * per_section
    return per_section, per_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--every", type=int, default=20, help="StepMonitor gathers every N steps")
    args = ap.parse_args()
    console = Console()

    devices = ["cpu"]
    try:
        import torch

        if torch.cuda.is_available():
            devices.append("cuda")
    except ImportError:
        pass
    micro = Table(title="StepMonitor hot-path cost (empty body)")
    for col in ("device", "µs per section", "µs per step() (excl. sections)"):
        micro.add_column(col, justify="right")
    costs = {}
    for dev in devices:
        costs[dev] = section_cost_us(dev)
        micro.add_row(dev, f"{costs[dev][0]:.2f}", f"{costs[dev][1]:.2f}")
    console.print(micro)

    t0 = time.perf_counter()
    off, on, inside = ab_runs(args.nproc, args.steps, args.repeats, args.every)
    wall = time.perf_counter() - t0
    base, mon = statistics.median(off), statistics.median(on)
    est = SECTIONS_PER_STEP * costs["cpu"][0] * 1e-6 + statistics.median(inside)
    table = Table(title=f"Monitor overhead on the workload ({args.nproc} ranks, CPU/gloo, {args.repeats} repeats)")
    for col in ("metric", "value"):
        table.add_column(col, justify="right")
    table.add_row("median step without monitor", f"{base * 1e3:.2f} ms  ({', '.join(f'{x * 1e3:.1f}' for x in off)})")
    table.add_row("median step with monitor", f"{mon * 1e3:.2f} ms  ({', '.join(f'{x * 1e3:.1f}' for x in on)})")
    table.add_row("measured overhead", f"{(mon / base - 1) * 100:+.2f} %")
    spread = (max(off) - min(off)) / base * 100
    table.add_row("run-to-run spread without monitor", f"{spread:.1f} %  (the A/B resolution)")
    table.add_row(
        f"direct: 5 sections + mon.step() (gather every {args.every})",
        f"{est * 1e6:.1f} µs = {est / base * 100:.3f} % of a step",
    )
    table.add_row("bench wall time", f"{wall:.0f} s")
    console.print(table)


if __name__ == "__main__":
    main()
