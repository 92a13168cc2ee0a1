"""Accuracy of ``gpufleet diagnose`` on the real test workload: does the top finding name the injected fault?

Runs the torchrun workload (4 ranks on CPU, gloo) under every fault kind, over several seeds, ranks and
magnitudes, reads its profiler traces back and diagnoses them. Prints one row per run and the confusion
table (injected category -> category of the top alarming finding, or "none"); the bar is >= 95 % of
faulted runs with the right rank and category on top, and no alarm on the no-fault runs.

    python bench/diagnose_accuracy.py                    # 36 runs, about 20 min on 2 cores
    python bench/diagnose_accuracy.py --seeds 1 --quick  # one run per fault kind
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from gpufleet.diagnose.analyzer import TraceAnalyzer
from gpufleet.diagnose.workload import run_workload

#: fault kind -> magnitudes to try
MAGNITUDES = {
    "none": [0.0],
    "slow-rank": [1.0, 0.6],
    "slow-data": [0.03, 0.06],
    "python-pause": [0.1, 0.2],
    "slow-collective": [0.03, 0.06],
    "sync": [4.0, 8.0],
    "hang": [-1.0],
}
CATEGORY = {
    "none": "none",
    "slow-rank": "compute",
    "slow-data": "data_loading",
    "python-pause": "cpu_stall",
    "slow-collective": "communication",
    "sync": "sync",
    "hang": "hang",
}


def plan(seeds: int, quick: bool, nproc: int) -> list[tuple[str, int | None, float, int]]:
    """(kind, rank, magnitude, seed) of every run: faults rotate over ranks and magnitudes as seeds grow."""
    runs = []
    for kind, seed in itertools.product(MAGNITUDES, range(seeds)):
        mags = MAGNITUDES[kind][:1] if quick else MAGNITUDES[kind]
        for i, mag in enumerate(mags):
            rank = None if kind == "none" else (seed * len(mags) + i + 1) % nproc
            runs.append((kind, rank, mag, seed))
        if kind == "none" and not quick:  # as many no-fault runs as runs of one fault kind, and one more
            runs += [(kind, None, 0.0, seed + 100), (kind, None, 0.0, seed + 200)]
        if kind == "hang" and not quick:
            runs.append((kind, (seed + 2) % nproc, MAGNITUDES[kind][0], seed + 100))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one magnitude per fault kind")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None, help="keep the traces here (default: a temp folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write the per-run rows here")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="diagnose-accuracy-"))
    rows = []
    print("| # | fault | rank | magnitude | seed | top finding (rank, category, function) | ms/step | score | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, (kind, rank, mag, seed) in enumerate(plan(args.seeds, args.quick, args.nproc), 1):
        spec = "none" if kind == "none" else f"{kind}:{rank}:{mag:g}" if mag >= 0 else f"{kind}:{rank}"
        folder = root / f"{n:02d}-{spec.replace(':', '_')}"
        t0 = time.perf_counter()
        run_workload(folder, fault=spec, nproc=args.nproc, steps=args.steps, seed=seed)
        run_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        diagnosis = TraceAnalyzer(folder).diagnose()
        diag_s = time.perf_counter() - t0
        alarms = diagnosis.alarms
        top = alarms[0] if alarms else None
        got = top.category if top else "none"
        ok = (not alarms) if kind == "none" else (top is not None and top.rank == rank and got == CATEGORY[kind])
        rows.append(
            {
                "fault": kind,
                "rank": rank,
                "magnitude": mag,
                "seed": seed,
                "top_rank": top.rank if top else None,
                "top_category": got,
                "top_function": top.function if top else None,
                "cost_s_per_step": top.cost_s_per_step if top else 0.0,
                "score": top.score if top else 0.0,
                "ok": ok,
                "run_s": run_s,
                "diagnose_s": diag_s,
                "step_s": diagnosis.step_s_median,
            }
        )
        desc = f"{top.rank}, {got}, {top.function[:40]}" if top else "no alarm"
        print(
            f"| {n} | {kind} | {rank} | {mag:g} | {seed} | {desc} | "
            f"{(top.cost_s_per_step * 1e3 if top else 0):.1f} | {(top.score if top else 0):.1f} | "
            f"{'yes' if ok else '**no**'} |",
            flush=True,
        )
    print()
    cats = list(dict.fromkeys(CATEGORY.values()))
    confusion = Counter((CATEGORY[r["fault"]], r["top_category"]) for r in rows)
    got_cats = sorted({r["top_category"] for r in rows} | set(cats), key=lambda c: (c not in cats, c))
    print("| injected \\ top finding | " + " | ".join(got_cats) + " | right rank+category |")
    print("|---" * (len(got_cats) + 2) + "|")
    for c in cats:
        mine = [r for r in rows if CATEGORY[r["fault"]] == c]
        if not mine:
            continue
        cells = " | ".join(str(confusion.get((c, g), 0) or "") for g in got_cats)
        print(f"| {c} | {cells} | {sum(r['ok'] for r in mine)}/{len(mine)} |")
    faulted = [r for r in rows if r["fault"] != "none"]
    clean = [r for r in rows if r["fault"] == "none"]
    print()
    print(
        f"faulted runs with the right rank and category on top: {sum(r['ok'] for r in faulted)}/{len(faulted)} "
        f"({100 * sum(r['ok'] for r in faulted) / max(len(faulted), 1):.1f} %, bar 95 %)"
    )
    print(f"no-fault runs without an alarm: {sum(r['ok'] for r in clean)}/{len(clean)}")
    print(
        f"median diagnose time per run: {sorted(r['diagnose_s'] for r in rows)[len(rows) // 2]:.2f} s; traces in {root}"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
