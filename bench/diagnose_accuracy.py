"""Accuracy of ``gpufleet diagnose`` on a fault suite: does the top alarm name the faulty rank and category?

Runs the torchrun workload (4 ranks on CPU, gloo) in five workloads of three families -- the ``lm`` job with its
own bucketed all-reduce and sections, a transformer under torch DDP, a CNN under DDP fed by a DataLoader without
and with worker processes, and DDP with gradient accumulation (``no_sync``) -- under eight fault kinds at two
magnitudes on rotating ranks, plus clean runs. It reads the traces back, diagnoses them, and prints one row per
run and a summary per half.

The suite is split BEFORE any tuning, here in code: a run belongs to the held-apart half when
``(workload index + seed) % 2 == 1``, so every workload has seeds on both sides and every seed both workloads.
Thresholds were tuned on the ``tune`` half only; the ``held`` half was run once, at the end.

    python bench/diagnose_accuracy.py                     # both halves, 92 runs, ~23 min on 2 cores
    python bench/diagnose_accuracy.py --half tune --out /tmp/tune   # keep the traces ...
    python bench/diagnose_accuracy.py --half tune --out /tmp/tune --reuse   # ... and re-diagnose them only
    python bench/diagnose_accuracy.py --quick             # 3 workloads, one clean run each: 50 runs, ~12 min
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpufleet.diagnose.analyzer import TraceAnalyzer
from gpufleet.diagnose.faults import FAULTS
from gpufleet.diagnose.workload import run_workload

#: workload name -> workload flags
WORKLOADS = {
    "lm": ["--family", "lm"],
    "lm-ddp": ["--family", "lm-ddp"],
    "cnn-ddp": ["--family", "cnn-ddp", "--batch", "16"],
    "cnn-ddp-workers": ["--family", "cnn-ddp", "--batch", "16", "--workers", "2"],
    "lm-accum": ["--family", "lm-accum", "--bucket-mb", "0.05"],
}
QUICK_WORKLOADS = ("lm", "lm-ddp", "cnn-ddp-workers")
#: fault kind -> its two magnitudes (a run takes one of them, alternating over workloads and seeds)
MAGNITUDES = {
    "slow-rank": [1.0, 0.5],
    "slow-data": [0.06, 0.03],
    "host-before": [0.06, 0.03],
    "host-after": [0.06, 0.03],
    "sync": [8.0, 4.0],
    "slow-collective": [0.06, 0.03],
    "hang": [-1.0, 6.0],
    "python-pause": [0.2, 0.1],  # periodic pauses between forward and backward: the lm workload only
}
#: per workload: magnitudes that differ. With 2 worker processes a slow batch only stalls training once the loader
#: falls behind the step (~70 ms here): 30-60 ms per batch would not show at all
WORKLOAD_MAGNITUDES = {"cnn-ddp-workers": {"slow-data": [0.15, 0.1]}}
ONLY_LM = ("python-pause",)
CLEAN_RUNS = 2
HANG_FLAGS = ["--hang-timeout", "3"]


@dataclass(frozen=True)
class Run:
    """One run of the suite: workload, fault kind (``none`` when clean), rank, magnitude, seed and half."""

    workload: str
    kind: str
    rank: int | None
    magnitude: float
    seed: int
    half: str

    @property
    def spec(self) -> str:
        """The workload's ``--fault`` value."""
        if self.kind == "none":
            return "none"
        return f"{self.kind}:{self.rank}:{self.magnitude:g}" if self.magnitude >= 0 else f"{self.kind}:{self.rank}"

    @property
    def category(self) -> str:
        """The root-cause category a correct diagnosis names (``none`` for a clean run)."""
        return "none" if self.kind == "none" else FAULTS[self.kind][0]


def half_of(workload_index: int, seed: int) -> str:
    """The fixed split: held apart when workload index + seed is odd."""
    return "held" if (workload_index + seed) % 2 else "tune"


def plan(seeds: int, quick: bool, nproc: int) -> list[Run]:
    """Every run of the suite, both halves: faults rotate over ranks and magnitudes with workload and seed."""
    runs = []
    for w, name in enumerate(WORKLOADS):
        if quick and name not in QUICK_WORKLOADS:
            continue
        for seed in range(seeds):
            half = half_of(w, seed)
            for k, kind in enumerate(MAGNITUDES):
                if kind in ONLY_LM and name != "lm":
                    continue
                mag = WORKLOAD_MAGNITUDES.get(name, {}).get(kind, MAGNITUDES[kind])[(w + seed + k) % 2]
                runs.append(Run(name, kind, (w + seed + 3 * k) % nproc, mag, seed, half))
            for c in range(1 if quick else CLEAN_RUNS):
                runs.append(Run(name, "none", None, 0.0, seed + 100 * c, half))
    return runs


def diagnose_run(run: Run, folder: Path) -> dict:
    """Diagnose one run's traces and judge the top alarm against the injected fault."""
    t0 = time.perf_counter()
    diagnosis = TraceAnalyzer(folder).diagnose()
    diag_s = time.perf_counter() - t0
    alarms = diagnosis.alarms
    top = alarms[0] if alarms else None
    got = top.category if top else "none"
    ok = (not alarms) if run.kind == "none" else (top is not None and top.rank == run.rank and got == run.category)
    return {
        **run.__dict__,
        "spec": run.spec,
        "top_rank": top.rank if top else None,
        "top_category": got,
        "top_function": top.function if top else None,
        "top_localiser": top.localiser if top else None,
        "cost_s_per_step": top.cost_s_per_step if top else 0.0,
        "score": float(top.score) if top else 0.0,
        "ok": ok,
        "diagnose_s": diag_s,
        "step_s": diagnosis.step_s_median,
    }


def summary(rows: list[dict], half: str) -> list[str]:
    """The summary lines of one half: faulted runs right, top alarm right, clean runs silent, per fault kind."""
    mine = [r for r in rows if r["half"] == half]
    if not mine:
        return []
    faulted = [r for r in mine if r["kind"] != "none"]
    clean = [r for r in mine if r["kind"] == "none"]
    alarmed = [r for r in faulted if r["top_category"] != "none"]
    right = sum(r["ok"] for r in faulted)
    lines = [
        f"**{half} half**: faulted runs with the faulty rank and right category as the top alarm: "
        f"{right}/{len(faulted)} ({100 * right / max(len(faulted), 1):.1f} %, "
        f"bar 95 %); faulted runs with an alarm: {len(alarmed)}/{len(faulted)}; "
        f"clean runs without an alarm: {sum(r['ok'] for r in clean)}/{len(clean)}",
        "",
        "| fault \\ workload | " + " | ".join(WORKLOADS) + " | all |",
        "|---" * (len(WORKLOADS) + 2) + "|",
    ]
    for kind in ["none", *MAGNITUDES]:
        cells = []
        for w in [*WORKLOADS, None]:
            sel = [r for r in mine if r["kind"] == kind and (w is None or r["workload"] == w)]
            cells.append(f"{sum(r['ok'] for r in sel)}/{len(sel)}" if sel else "")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2, help="seeds per workload (the halves alternate over them)")
    ap.add_argument("--half", choices=("tune", "held", "both"), default="both")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_WORKLOADS)}; one clean run each")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None, help="keep the traces here (default: a temp folder)")
    ap.add_argument("--reuse", action="store_true", help="diagnose traces already in --out; run nothing")
    ap.add_argument("--json", type=Path, default=None, help="also write the per-run rows here")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="diagnose-accuracy-"))
    runs = [r for r in plan(args.seeds, args.quick, args.nproc) if args.half in ("both", r.half)]
    rows = []
    print("| # | half | workload | fault | seed | top alarm (rank, category, function) | ms/step | score | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    t_start = time.perf_counter()
    for n, run in enumerate(runs, 1):
        folder = root / f"{run.half}-{run.workload}-{run.seed}-{run.spec.replace(':', '_')}"
        done = (folder / "fault.json").exists() and len(list(folder.glob("rank-*.json.gz"))) == args.nproc
        if not args.reuse and not done:  # a folder with every rank's trace is kept: an interrupted suite resumes
            extra = [*WORKLOADS[run.workload], *(HANG_FLAGS if run.kind == "hang" else [])]
            try:
                run_workload(folder, fault=run.spec, nproc=args.nproc, steps=args.steps, seed=run.seed, extra=extra)
            except Exception as e:  # a workload that fails is reported, not the end of the suite
                print(f"| {n} | {run.half} | {run.workload} | {run.spec} | {run.seed} | run failed: {str(e)[:80]!r} |")
                continue
        try:
            row = diagnose_run(run, folder)
        except Exception as e:  # a diagnosis that fails is a wrong answer, not the end of the suite
            row = {**run.__dict__, "spec": run.spec, "top_rank": None, "top_category": f"error: {e}"[:60],
                   "top_function": None, "cost_s_per_step": 0.0, "score": 0.0, "ok": False}  # fmt: skip
        rows.append(row)
        desc = f"{row['top_rank']}, {row['top_category']}, {(row['top_function'] or '')[:44]}"
        print(
            f"| {n} | {run.half} | {run.workload} | {run.spec} | {run.seed} | "
            f"{desc if row['top_category'] != 'none' else 'no alarm'} | {row['cost_s_per_step'] * 1e3:.1f} | "
            f"{row['score']:.1f} | {'yes' if row['ok'] else '**no**'} |",
            flush=True,
        )
    print()
    for half in ("tune", "held"):
        for line in summary(rows, half):
            print(line)
        print()
    print(f"{len(rows)} runs in {time.perf_counter() - t_start:.0f} s; traces in {root}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
