"""Simulator speed: whole-trace runs end to end, a 1M-job run on a 100k-GPU cluster, and the event-driven
engine against a round-based reference engine on the same jobs. Prints one table; run with
``python bench/sim_speed.py [--quick]``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from gpufleet.sim.run import run_policies
from gpufleet.spec import ClusterSpec, load_cluster
from gpufleet.traces import generate_jobs, load_trace
from naive_engine import naive_fifo


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(quick: bool = False) -> None:
    console = Console(width=150)
    table = Table(title="gpufleet simulator speed (2-core machine)", header_style="bold")
    for col in ("case", "jobs", "GPUs", "policy", "end-to-end s", "sim s", "events/s", "jobs/s", "note"):
        table.add_column(col, justify="left" if col in ("case", "policy", "note") else "right")

    # 1. Philly, end to end including reading the trace, on two cluster sizes where queues form
    for gpus in (768, 512):
        for policy in ("fifo", "tiresias"):

            def run(policy=policy, gpus=gpus):
                jobs = load_trace("philly").jobs
                cluster = load_cluster().resized(gpus)
                return run_policies(jobs, cluster, [policy])[0]

            r, wall = timed(run)
            s = r.summary
            table.add_row(
                "philly",
                f"{s['jobs']:,}",
                f"{gpus:,}",
                policy,
                f"{wall:.2f}",
                f"{s['wall_s']:.2f}",
                f"{s['events'] / s['wall_s']:,.0f}",
                f"{s['jobs'] / s['wall_s']:,.0f}",
                f"avg queue {s['avg_queue_s']:,.0f} s, {s['preemptions']:,} preemptions",
            )

    # 2. 1,000,000 synthetic jobs on a 100,000-GPU cluster at 80 % offered load
    n_big = 100_000 if quick else 1_000_000

    def big():
        jobs = generate_jobs(n_big, seed=1)
        # stretch or squeeze arrivals so the offered load is 80 % of the cluster
        offered = float((jobs["num_gpus"] * jobs["duration_s"]).sum()) / float(jobs["submit_s"].max())
        jobs = jobs.with_columns(jobs["submit_s"] * (offered / (0.8 * 100_000)))
        return run_policies(jobs, ClusterSpec.single_pool(100_000, gpu="h100"), ["fifo"])[0]

    r, wall = timed(big)
    s = r.summary
    table.add_row(
        "synthetic",
        f"{s['jobs']:,}",
        "100,000",
        "fifo",
        f"{wall:.2f}",
        f"{s['wall_s']:.2f}",
        f"{s['events'] / s['wall_s']:,.0f}",
        f"{s['jobs'] / s['wall_s']:,.0f}",
        f"util {100 * s['gpu_util']:.1f} %, avg queue {s['avg_queue_s']:,.0f} s",
    )

    # 3. event-driven engine vs a round-based reference (60 s rounds) on the same Philly slice
    n_slice = 10_000 if quick else 30_000
    jobs = load_trace("philly").jobs.head(n_slice)
    cluster = ClusterSpec.single_pool(512)
    ours = run_policies(jobs, cluster, ["fifo"])[0]
    naive_finish, naive_wall = timed(
        lambda: naive_fifo(
            jobs["submit_s"].to_numpy(), jobs["duration_s"].to_numpy(), jobs["num_gpus"].to_numpy(), 512, 60.0
        )
    )
    naive_jct = float(np.nanmean(naive_finish - jobs["submit_s"].to_numpy()))
    s = ours.summary
    table.add_row(
        "philly slice",
        f"{n_slice:,}",
        "512",
        "fifo (ours)",
        "",
        f"{s['wall_s']:.2f}",
        f"{s['events'] / s['wall_s']:,.0f}",
        f"{s['jobs'] / s['wall_s']:,.0f}",
        f"avg JCT {s['avg_jct_s']:,.0f} s",
    )
    table.add_row(
        "philly slice",
        f"{n_slice:,}",
        "512",
        "fifo (60 s rounds)",
        "",
        f"{naive_wall:.2f}",
        "",
        f"{n_slice / naive_wall:,.0f}",
        f"avg JCT {naive_jct:,.0f} s; ours is {naive_wall / s['wall_s']:.1f}x faster",
    )
    console.print(table)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
