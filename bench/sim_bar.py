"""Issue 23's speed bar, beside the engine before the merge: Philly end to end on the default cluster (fifo,
tiresias, aryl) and 1M jobs on 100k GPUs at ``--load 0.8`` (fifo, tiresias), each case in its own process.

The baseline is the Philly cases run by the source tree of ``--base`` (default: the commit before the one-engine
work, where the elastic and the gang engines were two), checked out in a temporary git worktree. The load
case has none: its trace comes from the new generator, as the old one could not load a cluster.
Run with ``python bench/sim_bar.py [--quick] [--base REV] [--no-base] [--regression]``; ``--quick`` uses 100k
jobs on 10k GPUs for the load case; ``--regression`` adds every pre-merge policy's avg JCT and queue, features
off, against the baseline (fifo, sjf, srtf, las, tiresias within 1 %, the Aryl variants within 3 %).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
#: the last commit before issue 23's engine merge (two engines, placement welded to ordering)
BASE = "0f6612f"
BARS = {("philly", "fifo"): 2.0, ("philly", "tiresias"): 10.0, ("philly", "aryl"): 15.0}
BIG_BARS = {"fifo": 90.0, "tiresias": 240.0}

#: one case, run in a child process so that each starts cold and the baseline can use its own source tree
CASE = r"""
import json, sys, time
t0 = time.perf_counter()
from gpufleet.sim.run import run_policies
from gpufleet.spec import ClusterSpec, load_cluster
from gpufleet.traces import generate_jobs, load_trace
kind, policy, n, gpus = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kind == "philly":
    jobs, cluster = load_trace("philly").jobs, load_cluster()
else:
    try:
        jobs = generate_jobs(n, seed=0, target_busy_gpus=0.8 * gpus, arrival="fitted")
    except TypeError:  # a generator without a target load: no comparable trace
        print(json.dumps({"error": "no --load in this version"})); sys.exit(0)
    cluster = ClusterSpec.single_pool(gpus, gpu="h100")
s = run_policies(jobs, cluster, [policy])[0].summary
print(json.dumps({"sim_s": s["wall_s"], "total_s": time.perf_counter() - t0, "avg_jct_s": s["avg_jct_s"],
                  "avg_queue_s": s["avg_queue_s"], "util_window": s.get("util_window"), "jobs": s["jobs"]}))
"""


def run_case(src: Path, kind: str, policy: str, n: int, gpus: int) -> dict:
    """One case under the source tree ``src``; its JSON line, or {"error": ...}."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    res = subprocess.run(
        [sys.executable, "-c", CASE, kind, policy, str(n), str(gpus)], capture_output=True, text=True, env=env
    )
    if res.returncode != 0:
        return {"error": (res.stderr.strip().splitlines() or ["failed"])[-1][:80]}
    return json.loads(res.stdout.strip().splitlines()[-1])


#: every policy that existed before the merge, run on the defaults for the regression table
REGRESSION = ("fifo", "sjf", "srtf", "las", "tiresias", "aryl", "aryl-loan", "aryl-elastic", "aryl-base")
TOLERANCE = {"aryl": 0.03, "aryl-loan": 0.03, "aryl-elastic": 0.03, "aryl-base": 0.03}


def regression_table(base_src: Path | None) -> Table:
    """Every pre-merge policy on Philly and the default cluster, features off: avg JCT and queue, both engines."""
    table = Table(title="regression: features off, Philly on the default cluster", header_style="bold")
    for col in ("policy", "avg JCT s", "before", "diff", "avg queue s", "before", "diff", "bar"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for policy in REGRESSION:
        new = run_case(ROOT / "src", "philly", policy, 0, 0)
        old = run_case(base_src, "philly", policy, 0, 0) if base_src is not None else {"error": "skipped"}
        if "error" in new or "error" in old:
            table.add_row(policy, new.get("error", ""), old.get("error", ""), *[""] * 5)
            continue
        tol = TOLERANCE.get(policy, 0.01)
        dj = new["avg_jct_s"] / old["avg_jct_s"] - 1.0
        dq = new["avg_queue_s"] / old["avg_queue_s"] - 1.0 if old["avg_queue_s"] else 0.0
        ok = abs(dj) <= tol and abs(dq) <= tol
        table.add_row(
            policy,
            f"{new['avg_jct_s']:,.1f}",
            f"{old['avg_jct_s']:,.1f}",
            f"{100 * dj:+.2f} %",
            f"{new['avg_queue_s']:,.1f}",
            f"{old['avg_queue_s']:,.1f}",
            f"{100 * dq:+.2f} %",
            f"{100 * tol:.0f} % {'ok' if ok else 'MISSED'}",
        )
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100k jobs on 10k GPUs for the load case")
    ap.add_argument("--base", default=BASE, help="git revision of the baseline engine")
    ap.add_argument("--no-base", action="store_true", help="skip the baseline")
    ap.add_argument("--regression", action="store_true", help="also every pre-merge policy against the baseline")
    ap.add_argument("--only-regression", action="store_true", help="only the regression table")
    args = ap.parse_args()
    n, gpus = (100_000, 10_000) if args.quick else (1_000_000, 100_000)
    cases = [("philly", p, 0, 0) for p in ("fifo", "tiresias", "aryl")]
    cases += [("load", p, n, gpus) for p in ("fifo", "tiresias")]
    console = Console(width=150)
    title = "one engine: simulation seconds on this machine (bar), against the engine before"
    table = Table(title=title, header_style="bold")
    columns = ("case", "policy", "sim s", "bar s", "end-to-end s", "before: sim s", "speed-up", "avg JCT s",
               "before: avg JCT s", "util_window", "avg queue s")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col in ("case", "policy") else "right")
    with tempfile.TemporaryDirectory() as tmp:
        base_src = None
        if not args.no_base:
            wt = Path(tmp) / "base"
            made = subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), args.base], capture_output=True
            )
            base_src = wt / "src" if made.returncode == 0 else None
            if base_src is None:
                console.print(f"baseline {args.base} unavailable: {made.stderr.decode().strip()[:120]}")
        try:
            if args.regression or args.only_regression:
                console.print(regression_table(base_src))
            if args.only_regression:
                return
            for kind, policy, cn, cg in cases:
                new = run_case(ROOT / "src", kind, policy, cn, cg)
                # the load case's trace comes from the new generator (the old one did not load a cluster): no baseline
                old = {"error": "new generator"} if kind == "load" else {"error": "skipped"}
                if base_src is not None and kind == "philly":
                    old = run_case(base_src, kind, policy, cn, cg)
                label = "philly, default cluster" if kind == "philly" else f"{cn:,} jobs / {cg:,} GPUs, load 0.8"
                bar = BARS.get((kind, policy)) if kind == "philly" else BIG_BARS[policy] if cn >= 1_000_000 else None
                if "error" in new:
                    table.add_row(label, policy, new["error"], *[""] * 8)
                    continue
                uw = new.get("util_window")
                table.add_row(
                    label,
                    policy,
                    f"{new['sim_s']:.2f}",
                    "" if bar is None else f"{bar:.0f} {'ok' if new['sim_s'] <= bar else 'MISSED'}",
                    f"{new['total_s']:.2f}",
                    old.get("error", f"{old.get('sim_s', 0):.2f}"),
                    f"{old['sim_s'] / new['sim_s']:.2f}x" if "sim_s" in old else "",
                    f"{new['avg_jct_s']:,.0f}",
                    f"{old['avg_jct_s']:,.0f}" if "avg_jct_s" in old else "",
                    "" if uw is None else f"{uw:.3f}",
                    f"{new['avg_queue_s']:,.0f}",
                )
        finally:
            if base_src is not None:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], capture_output=True)
    if not args.only_regression:
        console.print(table)


if __name__ == "__main__":
    main()
