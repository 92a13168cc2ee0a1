"""Does ``traces generate --load L`` load a cluster? Generate traces at several sizes and loads, simulate them,
and print the load asked beside the utilisation reached over the arrival window (``util_window``), the
queueing and the simulation time. Run with ``python bench/generator_load.py [--big]``: the default
(100k jobs on 10k GPUs at loads 0.8 and 0.5, Poisson and fitted arrivals) takes under a minute;
``--big`` adds 1M jobs on 100k GPUs (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from gpufleet.sim.run import run_policies
from gpufleet.spec import load_cluster
from gpufleet.traces import generate_jobs, plan_load, window_load

#: (jobs, GPUs, load) of the default run; --big adds the 1M-job / 100k-GPU case of issue 23.
CASES = [(100_000, 10_000, 0.8), (100_000, 10_000, 0.5)]
BIG = (1_000_000, 100_000, 0.8)
POLICIES = ("fifo", "tiresias")
#: Poisson arrivals hold the rate flat; "fitted" follows Philly's hour-of-week profile, whose peaks queue jobs.
ARRIVALS = ("poisson", "fitted")


def main(big: bool = False, policies: tuple[str, ...] = POLICIES) -> None:
    console = Console(width=150)
    table = Table(title="generator load: asked vs reached over the arrival window", header_style="bold")
    for col in ("jobs", "GPUs", "load", "arrival", "window", "max dur.", "offered", "policy", "util_window", "GPU util",
                "avg queue", "p95 queue", "gen s", "sim s"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("policy", "arrival") else "right")
    cases = [(*case, arrival) for case in ([*CASES, BIG] if big else CASES) for arrival in ARRIVALS]
    for n, gpus, load, arrival in cases:
        t0 = time.perf_counter()
        jobs = generate_jobs(n, seed=0, target_busy_gpus=load * gpus, arrival=arrival)
        gen_s = time.perf_counter() - t0
        plan = plan_load(n, load * gpus)
        window = float(jobs["submit_s"].max() - jobs["submit_s"].min())
        cluster = load_cluster().resized(gpus)  # as `gpufleet simulate --gpus`: the training pools hold `gpus`
        for result in run_policies(jobs, cluster, list(policies)):
            s = result.summary
            table.add_row(
                f"{n:,}",
                f"{gpus:,}",
                f"{load:.2f}",
                arrival,
                f"{window / 3600:.1f} h",
                f"{plan.max_duration_s / 3600:.1f} h",
                f"{window_load(jobs, gpus):.3f}",
                s["policy"],
                f"{s['util_window']:.3f}",
                f"{s['gpu_util']:.3f}",
                f"{s['avg_queue_s']:,.0f} s",
                f"{s['p95_queue_s']:,.0f} s",
                f"{gen_s:.2f}",
                f"{s['wall_s']:.1f}",
            )
    console.print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="also run 1M jobs on 100k GPUs at load 0.8")
    parser.add_argument("--policy", default=",".join(POLICIES), help="comma-separated policies")
    args = parser.parse_args()
    main(args.big, tuple(args.policy.split(",")))
