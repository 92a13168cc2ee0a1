"""Aryl on the bundled Philly trace with the bundled GenAI inference load: the issue's bar in one table.

Runs FIFO, Tiresias, the four Aryl variants and Aryl with random reclaiming on the default cluster, then
prints queueing, JCT and usage with their ratios against ``aryl-base`` (Aryl's paper compares against the
scheduler "without capacity loaning or elastic scaling"), the preemptions reclaiming caused, and the wall
time of each run (the end-to-end time of ``aryl`` is timed separately, trace loading included).

    python bench/aryl_eval.py                 # the bar
    python bench/aryl_eval.py --shares 0,0.25,0.5,0.75,1   # also sweep the elastic share for aryl
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

from gpufleet.sim.config import SimConfig
from gpufleet.sim.elastic_jobs import ElasticConfig
from gpufleet.sim.run import RunSpec, run_one, run_policies
from gpufleet.spec import load_cluster
from gpufleet.traces import load_trace
from gpufleet.traces.inference import load_inference

PUBLISHED = {"queue": 1.53, "jct": 1.50, "usage": 0.269}  # arXiv 2202.07896: 1.53x, 1.50x, +26.9 %
BAR = {"queue": 1.5, "jct": 1.4, "usage": 0.20}


def _row(table: Table, name: str, s: dict, base: dict) -> None:
    q, j, u = s["avg_queue_s"], s["avg_jct_s"], s.get("usage", float("nan"))
    table.add_row(
        name,
        f"{q:,.0f}",
        f"{s['p95_queue_s']:,.0f}",
        f"{base['avg_queue_s'] / max(q, 1e-9):.2f}x",
        f"{j:,.0f}",
        f"{base['avg_jct_s'] / j:.2f}x",
        f"{100 * u:.1f} %",
        f"{100 * (u / base['usage'] - 1):+.1f} %",
        f"{s.get('loaned_gpu_hours', 0):,.0f}",
        f"{s.get('reclaim_preemptions', 0):,}",
        f"{s.get('scale_events', 0):,}",
        f"{s['wall_s']:.1f}",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="processes for the policy sweep")
    ap.add_argument("--shares", default="", help="comma-separated elastic shares to sweep for aryl")
    args = ap.parse_args()
    con = Console(width=200)

    # end to end, as a user runs it: one process, trace and load included
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "gpufleet.cli", "simulate", "--policy", "aryl", "--json", "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True)
    e2e = time.perf_counter() - t0

    jobs = load_trace("philly").jobs
    cluster = load_cluster()
    until = float(jobs["submit_s"].max()) + 60 * 86400.0
    load = load_inference("genai", pool_servers=sum(p.nodes for p in cluster.inference_pools), until_s=until)
    policies = ["fifo", "tiresias", "aryl-base", "aryl-loan", "aryl-elastic", "aryl"]
    results = run_policies(
        jobs, cluster, policies, SimConfig(), workers=args.workers, inference=load, elastic=ElasticConfig()
    )
    rnd = run_one(
        RunSpec("aryl", jobs, cluster, SimConfig(), {"reclaim": "random"}, inference=load, elastic=ElasticConfig())
    )
    by = {r.policy: r.summary for r in results}
    base = by["aryl-base"]

    table = Table(
        title=f"Philly ({jobs.height:,} jobs) on {cluster.total_gpus():,} V100 + "
        f"{cluster.total_gpus('inference'):,} T4 (GenAI load); ratios against aryl-base",
        header_style="bold",
    )
    for col in (
        "policy",
        "avg queue s",
        "p95 queue s",
        "queue gain",
        "avg JCT s",
        "JCT gain",
        "usage",
        "usage gain",
        "loaned GPU-h",
        "reclaim preempt.",
        "scale events",
        "wall s",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for p in policies:
        _row(table, p, by[p], base)
    _row(table, "aryl reclaim=random", rnd.summary, base)
    con.print(table)

    a = by["aryl"]
    gains = {
        "queue": base["avg_queue_s"] / max(a["avg_queue_s"], 1e-9),
        "jct": base["avg_jct_s"] / a["avg_jct_s"],
        "usage": a["usage"] / base["usage"] - 1,
    }
    bar = Table(title="The bar", header_style="bold")
    for col in ("figure", "aryl vs aryl-base", "bar", "paper", "met"):
        bar.add_column(col, justify="left" if col == "figure" else "right")
    for k, label in (("queue", "avg queueing, x lower"), ("jct", "avg JCT, x lower"), ("usage", "usage, + %")):
        fmt = (lambda v: f"{100 * v:+.1f} %") if k == "usage" else (lambda v: f"{v:.2f}x")
        bar.add_row(label, fmt(gains[k]), fmt(BAR[k]), fmt(PUBLISHED[k]), "yes" if gains[k] >= BAR[k] else "NO")
    cost, random_ = a["reclaim_preemptions"], rnd.summary["reclaim_preemptions"]
    bar.add_row(
        "reclaim preemptions, cost / random",
        f"{cost:,} / {random_:,} = {cost / max(random_, 1):.2f}",
        "<= 0.50",
        "-",
        "yes" if cost <= 0.5 * random_ else "NO",
    )
    bar.add_row("aryl end to end (CLI, s)", f"{e2e:.1f}", "< 30", "-", "yes" if e2e < 30 else "NO")
    con.print(bar)

    if args.shares:
        sweep = Table(title="Elastic share sweep (aryl vs aryl-base)", header_style="bold")
        for col in ("elastic share", "avg queue s", "avg JCT s", "JCT gain", "usage", "scale events", "wall s"):
            sweep.add_column(col, justify="right")
        for share in (float(x) for x in args.shares.split(",")):
            r = run_one(
                RunSpec(
                    "aryl", jobs, cluster, SimConfig(), {}, inference=load, elastic=ElasticConfig(elastic_share=share)
                )
            ).summary
            sweep.add_row(
                f"{share:.2f}",
                f"{r['avg_queue_s']:,.0f}",
                f"{r['avg_jct_s']:,.0f}",
                f"{base['avg_jct_s'] / r['avg_jct_s']:.2f}x",
                f"{100 * r['usage']:.1f} %",
                f"{r['scale_events']:,}",
                f"{r['wall_s']:.1f}",
            )
        con.print(sweep)


if __name__ == "__main__":
    main()
