"""``gpufleet diagnose diff`` against Holistic Trace Analysis' ``TraceDiff.compare_traces`` on the same pair of runs.

Runs the diagnosis workload twice (torchrun, gloo on CPU) -- a control and a test with a change (a third layer and
twice the all-reduce buckets by default) -- or takes two existing folders, then compares per rank, for every op
present in both runs, the count and total duration that HTA 0.5.0 reports with what
:func:`gpufleet.diagnose.diff.op_totals` counts. HTA takes every step but the last (it drops the kernels the last
step launched), and so does the comparison. Prints one row per (run, rank) and the worst disagreement; the bar is
1 %. Also times both.

    pip install -e '.[bench]'
    python bench/diagnose_diff_parity.py [--nproc 2 --steps 4] [--control DIR --test DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import polars as pl

from gpufleet.diagnose.diff import diff_runs, op_totals
from gpufleet.diagnose.kineto import read_folder
from gpufleet.diagnose.workload import run_workload

CHANGE = ["--layers", "3", "--buckets", "4"]


def _traces_only(folder: Path, into: Path) -> Path:
    """A copy of the folder's trace files alone (HTA reads every JSON file in a folder as a trace)."""
    into.mkdir(parents=True, exist_ok=True)
    for f in sorted(folder.glob("rank-*.json*")):
        shutil.copy(f, into / f.name)
    return into


def _hta(control: Path, test: Path, rank: int, c_iters: list[int], t_iters: list[int]) -> pl.DataFrame:
    # HTA rounds float-microsecond traces to whole microseconds (start up, end down: an op under 1 us lasts -1 us);
    # with --hta-rounding it does, else HTA_DISABLE_NS_ROUNDING keeps the trace's own times, as gpufleet does
    from hta.trace_diff import TraceDiff  # the bench extra

    comp = TraceDiff.compare_traces(
        str(control), str(test), control_rank=rank, test_rank=rank, control_iteration=c_iters, test_iteration=t_iters
    )
    comp = comp.reset_index().rename(columns={"index": "name"})
    cols = {c: c.replace("Control_", "c_").replace("Test_", "t_") for c in comp.columns}
    return pl.from_pandas(comp.rename(columns=cols)).select(
        "name", "c_counts", "t_counts", "c_total_duration", "t_total_duration"
    )


def _ours(folder: Path, rank: int, iters: list[int]) -> pl.DataFrame:
    totals = op_totals(read_folder(folder).events)
    return (
        totals.filter((pl.col("rank") == rank) & pl.col("step").is_in(iters))
        .group_by(pl.col("function").alias("name"))
        .agg(pl.col("calls").sum(), (pl.col("total_ns").sum() / 1e3).alias("us"))
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--control", type=Path, default=None)
    ap.add_argument("--test", type=Path, default=None)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--hta-rounding", action="store_true", help="let HTA round times to whole microseconds")
    args = ap.parse_args()
    if not args.hta_rounding:
        os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    root = Path(tempfile.mkdtemp(prefix="diff-parity-"))
    if args.control is None or args.test is None:
        args.control = run_workload(root / "control", nproc=args.nproc, steps=args.steps, seed=0)
        args.test = run_workload(root / "test", nproc=args.nproc, steps=args.steps, seed=0, extra=CHANGE)
        print(f"control: the workload, {args.nproc} ranks, {args.steps} steps; test: the same with {' '.join(CHANGE)}")
    control, test = _traces_only(args.control, root / "c"), _traces_only(args.test, root / "t")
    t0 = time.perf_counter()
    diff = diff_runs(control, test)
    ours_s = time.perf_counter() - t0
    steps = {
        label: sorted(
            read_folder(folder).events.filter(pl.col("name").str.starts_with("ProfilerStep#"))["name"].unique()
        )
        for label, folder in (("c", control), ("t", test))
    }
    iters = {k: sorted(int(n.split("#")[1]) for n in v)[:-1] for k, v in steps.items()}
    print()
    print("| rank | ops in both runs | counts equal | total time within 1 % | worst time error | HTA s | gpufleet s |")
    print("|---|---|---|---|---|---|---|")
    worst_all = 0.0
    for rank in read_folder(control).ranks:
        t0 = time.perf_counter()
        hta = _hta(control, test, rank, iters["c"], iters["t"])
        hta_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        mine_c, mine_t = _ours(control, rank, iters["c"]), _ours(test, rank, iters["t"])
        mine_s = time.perf_counter() - t0
        both = hta.filter((pl.col("c_counts") > 0) & (pl.col("t_counts") > 0))
        joined = both.join(mine_c.rename({"calls": "oc", "us": "ous_c"}), on="name", how="left").join(
            mine_t.rename({"calls": "ot", "us": "ous_t"}), on="name", how="left"
        )
        joined = joined.fill_null(0)
        counts_ok = joined.filter((pl.col("oc") == pl.col("c_counts")) & (pl.col("ot") == pl.col("t_counts"))).height

        def rel(ours: str, theirs: str) -> pl.Expr:
            return ((pl.col(ours) - pl.col(theirs)).abs() / pl.max_horizontal(pl.col(theirs).abs(), pl.lit(1.0))).alias(
                "err"
            )

        errs = pl.concat(
            [joined.select(rel("ous_c", "c_total_duration")), joined.select(rel("ous_t", "t_total_duration"))]
        )
        within = int((joined.select(rel("ous_c", "c_total_duration"))["err"] <= 0.01).sum())
        within = min(within, int((joined.select(rel("ous_t", "t_total_duration"))["err"] <= 0.01).sum()))
        worst = float(errs["err"].max() or 0.0)
        worst_all = max(worst_all, worst)
        print(
            f"| {rank} | {joined.height} | {counts_ok}/{joined.height} | {within}/{joined.height} | "
            f"{100 * worst:.3f} % | {hta_s:.2f} | {mine_s:.2f} |"
        )
    print()
    print(f"worst disagreement on any op in both runs: {100 * worst_all:.3f} % (bar 1 %)")
    print(
        f"gpufleet diff of the whole job (every rank, both runs, self-time explanation included): {ours_s:.2f} s; "
        f"step {diff.control_step_s * 1e3:.1f} -> {diff.test_step_s * 1e3:.1f} ms, explained by: "
        + ", ".join(
            f"{r['function'][:40]} {r['delta_s_per_step'] * 1e3:+.1f} ms"
            for r in diff.explain.filter(pl.col("explains")).head(4).iter_rows(named=True)
        )
    )


if __name__ == "__main__":
    main()
