"""Accuracy of ``gpufleet diagnose`` on a fault suite: does the top alarm name the faulty rank and category?

Runs the torchrun workload (4 ranks on CPU, gloo) in five workloads of three families -- the ``lm`` job with its
own bucketed all-reduce and sections, a transformer under torch DDP, a CNN under DDP fed by a DataLoader without
and with worker processes, and DDP with gradient accumulation (``no_sync``) -- under eight fault kinds at two
magnitudes on rotating ranks, plus clean runs. It reads the traces back, diagnoses them, and prints one row per
run and a summary per half.

Round two's split, fixed in code BEFORE any run or tuning of that round. Round one held a run apart when
``(workload index + seed)`` was odd and drew its magnitude from the same parity, so each fault kind ran at ONE
magnitude per half; its held half has since been looked at, so it can no longer judge anything. Now:

- ``tune``: round one's runs, both of its halves (seeds 0 and 1, clean runs 100 and 101): between them every fault
  kind runs at both magnitudes on every workload, on rotating ranks. Thresholds and rules are tuned on these only.
- ``held``: fresh seeds from a disjoint range (``HELD_SEED0`` = 1000 on), never run before round two's single
  evaluation: every fault kind at BOTH magnitudes on every workload, ranks rotating with seed, kind and magnitude.

    python bench/diagnose_accuracy.py --half tune --out /tmp/suite --reuse   # re-diagnose the kept tuning traces
    nice -n 5 python bench/diagnose_accuracy.py --half held --out /tmp/suite # the held-apart set, once, at the end
    python bench/diagnose_accuracy.py --quick             # 3 workloads, one clean run each
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


#: held-apart seeds start here, far from the tuning seeds (0, 1 and clean runs 100, 101): no overlap, ever
HELD_SEED0 = 1000
#: tuning seeds per workload (round one's two halves, both used for tuning in round two)
TUNE_SEEDS = 2


def _tune_runs(w: int, name: str, quick: bool, nproc: int) -> list[Run]:
    """Round one's runs of one workload, both halves: over its two seeds every kind runs at both magnitudes."""
    runs = []
    for seed in range(TUNE_SEEDS):
        for k, kind in enumerate(MAGNITUDES):
            if kind in ONLY_LM and name != "lm":
                continue
            mag = WORKLOAD_MAGNITUDES.get(name, {}).get(kind, MAGNITUDES[kind])[(w + seed + k) % 2]
            runs.append(Run(name, kind, (w + seed + 3 * k) % nproc, mag, seed, "tune"))
        for c in range(1 if quick else CLEAN_RUNS):
            runs.append(Run(name, "none", None, 0.0, seed + 100 * c, "tune"))
    return runs


def _held_runs(w: int, name: str, held_seeds: int, quick: bool, nproc: int) -> list[Run]:
    """Fresh runs of one workload: every kind at both magnitudes per seed, ranks rotating over seed, kind, magnitude."""
    runs = []
    for j in range(held_seeds):
        seed = HELD_SEED0 + j
        for k, kind in enumerate(MAGNITUDES):
            if kind in ONLY_LM and name != "lm":
                continue
            for m, mag in enumerate(WORKLOAD_MAGNITUDES.get(name, {}).get(kind, MAGNITUDES[kind])):
                runs.append(Run(name, kind, (w + j + 3 * k + 2 * m + 1) % nproc, mag, seed, "held"))
        for c in range(1 if quick else CLEAN_RUNS):
            runs.append(Run(name, "none", None, 0.0, seed + 100 * c, "held"))
    return runs


def plan(quick: bool, nproc: int, held_seeds: int = 1) -> list[Run]:
    """Every run of the suite: the tuning runs, then the held-apart ones."""
    runs: list[Run] = []
    names = [(w, n) for w, n in enumerate(WORKLOADS) if not quick or n in QUICK_WORKLOADS]
    for w, name in names:
        runs += _tune_runs(w, name, quick, nproc)
    for w, name in names:
        runs += _held_runs(w, name, held_seeds, quick, nproc)
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
    ap.add_argument("--held-seeds", type=int, default=1, help=f"fresh seeds per workload from {HELD_SEED0} on")
    ap.add_argument("--half", choices=("tune", "held", "both"), default="both")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_WORKLOADS)}; one clean run each")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None, help="keep the traces here (default: a temp folder)")
    ap.add_argument("--reuse", action="store_true", help="diagnose traces already in --out; run nothing")
    ap.add_argument("--json", type=Path, default=None, help="also write the per-run rows here")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="diagnose-accuracy-"))
    runs = [r for r in plan(args.quick, args.nproc, args.held_seeds) if args.half in ("both", r.half)]
    rows = []
    print("| # | half | workload | fault | seed | top alarm (rank, category, function) | ms/step | score | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    t_start = time.perf_counter()
    for n, run in enumerate(runs, 1):
        folder = root / f"{run.workload}-{run.seed}-{run.spec.replace(':', '_')}"
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
