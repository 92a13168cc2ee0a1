"""Placements under every order on real traces with arrivals, network on: the bar of the learned-placement issue.

Per trace, every order (fifo, sjf, srtf, las, tiresias) x placement (consolidate, contention, rl, random) with
``--network``, beside each order's network-free JCT (consolidate, network off). Columns: average and p99 JCT,
ratios to consolidate and contention under the same order, wall time per job (the placement's decisions are
the difference to consolidate's). Then the **gap closed**: the share of the network penalty of the best
consolidate row (against the best network-free row) that the best rl row wins back; and the bar per trace.

Trace roles were fixed before any rl setting was chosen (docs/contention.md):
- validation (settings and checkpoints were chosen on these only): ElasticFlow cluster03, Philly jobs
  20,000-29,999;
- held apart (no selection looked at them): ElasticFlow cluster02 and cluster01, Philly jobs 60,000-69,999
  (these were run once at the end of the first rl session, so they have been seen once);
- held apart, fixed before the arrival-trained model (issue 24, second session) was trained and never run before
  its final evaluation: Philly jobs 40,000-49,999. Training windows never overlap a validation or held-apart
  window (:data:`EVAL_WINDOWS`).
- selection (issue 24, third session; fixed before any result on them was looked at): five Philly windows of
  10,000 jobs inside the training ranges (jobs 0-9,999, 10,000-19,999, 30,000-39,999, 50,000-59,999 and
  70,000-79,999). The wait rule has no weights, so the model's training data can serve to choose the rule; these
  widen what selection sees beyond the two validation traces. They run only with ``--role selection``.
- selection-small (issue 24, fourth session; fixed before any result on them was looked at): ten Philly windows of
  1,000 jobs inside the training ranges (starting at jobs 2,000, 7,000, 12,000, 17,000, 32,000, 37,000, 52,000,
  57,000, 72,000 and 77,000), sized by the same rule, so that selection sees clusters of a few nodes too. They run
  only with ``--role selection-small``. Sized by the rule they came out at 160-952 GPUs (dense in time), not the
  few nodes they were meant for, so:
- selection-thin (issue 24, fourth session; fixed before any result on them was looked at, after only their sizes
  had been computed): every 10th job (1,000 jobs) and every 20th from the 5th (500 jobs) of the 10,000-job Philly
  ranges at 0k, 10k, 30k, 50k and 70k (training ranges), sized by the same rule: 16-80 GPUs. They run only with
  ``--role selection-thin``.

Each cluster is the default cluster resized so that the trace offers 90 % of its GPUs' time over its arrival
window (at least the largest job), so that queues form.

    python bench/placement_eval.py                      # every trace
    python bench/placement_eval.py --role validation     # what selection may look at
    python bench/placement_eval.py --role selection      # the training windows selection may also look at
    python bench/placement_eval.py --role selection-small   # 1,000-job training windows
    python bench/placement_eval.py --role selection-thin    # thinned training windows (clusters of a few nodes)
    python bench/placement_eval.py --traces ef02 --orders srtf --placements consolidate,rl
    python bench/placement_eval.py --trace-file my_cluster.csv --columns elasticflow   # the bar on your own trace
    python bench/placement_eval.py --role validation --rl-option budget=0 --rl-option outlook=0.5
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.table import Table

from gpufleet.errors import GpufleetError
from gpufleet.perf.comm_profiles import with_comm_profiles
from gpufleet.sim.config import SimConfig
from gpufleet.sim.run import RunSpec, run_one
from gpufleet.spec import load_cluster
from gpufleet.traces import load_trace
from gpufleet.traces.info import gpus_for_load
from gpufleet.traces.load import bundled_trace_path

ORDERS = ("fifo", "sjf", "srtf", "las", "tiresias")
PLACEMENTS = ("consolidate", "contention", "rl", "random")
#: Share of the cluster's GPU-time the trace offers over its arrival window (sizing rule, fixed a priori).
TARGET_LOAD = 0.9
ELASTICFLOW_COLUMNS = {
    "submit": "submission_time",
    "duration": "duration",
    "gpus": "num_gpu",
    "job_id": "job_id",
    "model": "model_name",
}
console = Console(width=200)


@dataclass(frozen=True)
class TraceCase:
    """One bench trace: a name, its role in selection, and how to read it."""

    name: str
    role: str  # "validation" or "held-apart"
    source: str  # "philly", a bundled ElasticFlow file name, or a path (role "external")
    start: int = 0  # Philly window: first job (in submit order) and job count
    jobs: int = 0
    stride: int = 1  # Philly window thinned to every stride-th job of the window, from its offset-th
    offset: int = 0


CASES = (
    TraceCase("ef03", "validation", "elasticflow_cluster03.csv.gz"),
    TraceCase("philly-20k", "validation", "philly", 20_000, 10_000),
    TraceCase("ef02", "held-apart", "elasticflow_cluster02.csv.gz"),
    TraceCase("ef01", "held-apart", "elasticflow_cluster01.csv.gz"),
    TraceCase("philly-60k", "held-apart", "philly", 60_000, 10_000),
    TraceCase("philly-40k", "held-apart", "philly", 40_000, 10_000),
)
#: Philly job ranges (in submit order) that evaluation uses; training must draw its windows outside them.
EVAL_WINDOWS = tuple((c.start, c.start + c.jobs) for c in CASES if c.source == "philly")
#: Philly windows inside the training ranges on which the wait rule may also be chosen (not in the default run).
SELECTION_CASES = tuple(
    TraceCase(f"philly-{k}k-sel", "selection", "philly", 1000 * k, 10_000) for k in (0, 10, 30, 50, 70)
)
#: Small Philly windows (1,000 jobs) inside the training ranges, sized by the same rule, so that selection also sees
#: clusters of a few nodes (issue 24, fourth session; fixed before any result on them was looked at). Run only with
#: ``--role selection-small``.
SMALL_CASES = tuple(
    TraceCase(f"philly-{k}k-small", "selection-small", "philly", 1000 * k, 1_000)
    for k in (2, 7, 12, 17, 32, 37, 52, 57, 72, 77)
)
#: Thinned Philly windows inside the training ranges: every 10th job (1,000 jobs) and every 20th from the 5th (500
#: jobs) of the 10,000-job ranges at 0k, 10k, 30k, 50k and 70k, sized by the same rule: 16-80 GPUs, clusters of 2-10
#: nodes (the 1,000-job windows above, dense in time, come out at 160-952 GPUs). Issue 24, fourth session; fixed
#: before any result on them was looked at. Run only with ``--role selection-thin``.
THIN_CASES = tuple(
    TraceCase(f"philly-{k}k-thin{stride}", "selection-thin", "philly", 1000 * k, 10_000, stride, offset)
    for k in (0, 10, 30, 50, 70)
    for stride, offset in ((10, 0), (20, 5))
)


def load_case(case: TraceCase, columns: dict[str, str] | None = ELASTICFLOW_COLUMNS) -> pl.DataFrame:
    """The case's jobs with communication profiles (ElasticFlow: from the model names; Philly: equal mix).
    An external (or selection-file) case is read from its path with ``columns`` (None: the trace's own canonical
    columns)."""
    if case.source == "philly":
        jobs = load_trace("philly").jobs.sort("submit_s").slice(case.start, case.jobs)
        jobs = jobs.gather_every(case.stride, case.offset) if case.stride > 1 else jobs
        jobs = jobs.with_columns(pl.col("submit_s") - pl.col("submit_s").min())
    elif case.role in ("external", "selection-file"):  # a path
        jobs = load_trace(case.source, columns=columns).jobs
        jobs = jobs.with_columns(pl.col("submit_s") - pl.col("submit_s").min())
    else:
        jobs = load_trace(str(bundled_trace_path(case.source)), columns=ELASTICFLOW_COLUMNS).jobs
    return with_comm_profiles(jobs, None)


def rl_options(pairs: list[str]) -> dict[str, float | str]:
    """``KEY=VALUE`` pairs as options of the ``rl`` placement; an unknown key or a bad number names the fix."""
    from gpufleet.sched.placement.rl import RLPlacement

    opts: dict[str, float | str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in RLPlacement.options:
            raise SystemExit(f"--rl-option {pair!r}: use KEY=VALUE with KEY one of {', '.join(RLPlacement.options)}")
        if isinstance(RLPlacement.options[key], str):
            opts[key] = value
            continue
        try:
            opts[key] = float(value)
        except ValueError:
            raise SystemExit(f"--rl-option {pair!r}: {key} takes a number") from None
    return opts


def trace_columns(text: str) -> dict[str, str] | None:
    """``--columns``: 'elasticflow' (ElasticFlow's names), 'canonical' (None: the trace's own canonical columns),
    or ElasticFlow's names with ``KEY=COLUMN`` pairs (comma-separated) renamed; a bad pair names the fix."""
    if text == "canonical":
        return None
    cols = dict(ELASTICFLOW_COLUMNS)
    for pair in text.split(",") if text != "elasticflow" else []:
        key, sep, col = pair.partition("=")
        if not sep or key not in cols or not col:
            raise SystemExit(
                f"--columns {text!r}: use 'elasticflow', 'canonical' or KEY=COLUMN pairs with KEY one of "
                f"{', '.join(cols)}"
            )
        cols[key] = col
    return cols


def sized_gpus(jobs: pl.DataFrame, load: float = TARGET_LOAD, gpus_per_node: int = 8) -> int:
    """The bench's fixed sizing rule: :func:`gpufleet.traces.info.gpus_for_load` at ``load``, in nodes of 8 GPUs."""
    return gpus_for_load(jobs, load, gpus_per_node)


def run_case(
    case: TraceCase,
    orders: list[str],
    placements: list[str],
    rl_opts: dict[str, float | str],
    columns: dict[str, str] | None = ELASTICFLOW_COLUMNS,
) -> pl.DataFrame:
    """Every order x placement (and each order network-free) on the case's trace, sized so that it queues."""
    jobs = load_case(case, columns)
    gpus = sized_gpus(jobs)
    spec = load_cluster(None).resized(gpus)
    rows = []
    for order in orders:
        runs = [(order, "free", SimConfig(network=False), {})]
        for pl_name in placements:
            label = order if pl_name == "consolidate" else f"{order}+{pl_name}"
            opts = rl_opts if pl_name == "rl" else {}
            runs.append((label, pl_name, SimConfig(network=True), opts))
        for label, pl_name, cfg, opts in runs:
            t0 = time.perf_counter()
            s = run_one(RunSpec(label, jobs, spec, cfg, placement_opts=opts)).summary
            wall = time.perf_counter() - t0
            if s["finished"] < s["jobs"]:
                raise SystemExit(f"{case.name} {label}: finished {s['finished']} of {s['jobs']} jobs")
            rows.append(
                {
                    "trace": case.name,
                    "role": case.role,
                    "gpus": gpus,
                    "order": order,
                    "placement": pl_name,
                    "avg_jct_s": s["avg_jct_s"],
                    "p99_jct_s": s["p99_jct_s"],
                    "contention_gpu_h": s.get("contention_gpu_h", 0.0),
                    "us_per_job": 1e6 * wall / max(s["jobs"], 1),
                }
            )
            console.log(f"{case.name} {label:<22} {'net' if cfg.network else 'free'}: {s['avg_jct_s']:,.0f} s")
    return pl.DataFrame(rows)


def _get(frame: pl.DataFrame, order: str, placement: str, key: str) -> float:
    hit = frame.filter((pl.col("order") == order) & (pl.col("placement") == placement))
    return float(hit[key][0]) if hit.height else math.nan


def _name(row: dict) -> str:
    return f"{row['order']} {row['avg_jct_s']:,.0f} s"


def report(frame: pl.DataFrame) -> list[tuple[str, str, bool]]:
    """Print the per-trace table and bar; return (trace, bar, met) rows."""
    verdicts = []
    case = frame["trace"][0]
    orders = list(dict.fromkeys(frame["order"].to_list()))
    table = Table(
        title=f"{case} ({frame['role'][0]}, {frame['gpus'][0]} GPUs, network on unless 'free')", header_style="bold"
    )
    for col in (
        "order",
        "placement",
        "avg JCT s",
        "p99 JCT s",
        "vs consolidate",
        "vs contention",
        "p99 vs consolidate",
        "contention GPU-h",
        "us/job",
    ):
        table.add_column(col, justify="left" if col in ("order", "placement") else "right")
    for r in frame.iter_rows(named=True):
        cons = _get(frame, r["order"], "consolidate", "avg_jct_s")
        cont = _get(frame, r["order"], "contention", "avg_jct_s")
        p99c = _get(frame, r["order"], "consolidate", "p99_jct_s")
        net = r["placement"] != "free"
        table.add_row(
            r["order"],
            r["placement"] if net else "(network-free)",
            f"{r['avg_jct_s']:,.0f}",
            f"{r['p99_jct_s']:,.0f}",
            f"{r['avg_jct_s'] / cons:.3f}" if net else "-",
            f"{r['avg_jct_s'] / cont:.3f}" if net and not math.isnan(cont) else "-",
            f"{r['p99_jct_s'] / p99c:.3f}" if net else "-",
            f"{r['contention_gpu_h']:,.0f}",
            f"{r['us_per_job']:,.0f}",
        )
    console.print(table)
    best = {
        p: frame.filter(pl.col("placement") == p).sort("avg_jct_s").row(0, named=True)
        for p in ("free", "consolidate", "rl")
        if frame.filter(pl.col("placement") == p).height
    }
    if "rl" not in best:
        return verdicts
    pen = best["consolidate"]["avg_jct_s"] - best["free"]["avg_jct_s"]
    won = best["consolidate"]["avg_jct_s"] - best["rl"]["avg_jct_s"]
    closed = won / pen if pen > 0 else math.nan
    for order in orders:
        rl = _get(frame, order, "rl", "avg_jct_s")
        cons = _get(frame, order, "consolidate", "avg_jct_s")
        cont = _get(frame, order, "contention", "avg_jct_s")
        verdicts.append((case, f"{order}: rl <= 1.01 x consolidate ({rl / cons:.3f})", rl <= 1.01 * cons))
        if not math.isnan(cont):
            verdicts.append((case, f"{order}: rl <= 1.02 x contention ({rl / cont:.3f})", rl <= 1.02 * cont))
        p99r, p99c = _get(frame, order, "rl", "p99_jct_s"), _get(frame, order, "consolidate", "p99_jct_s")
        verdicts.append((case, f"{order}: rl p99 <= consolidate ({p99r / p99c:.3f})", p99r <= p99c))
    verdicts.append(
        (
            case,
            f"gap closed >= 40 % ({100 * closed:.0f} %: best consolidate {_name(best['consolidate'])}, "
            f"best free {_name(best['free'])}, best rl {_name(best['rl'])})",
            bool(pen <= 0 or closed >= 0.4),
        )
    )
    return verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", help="bundled traces to run (default: every one, or none with --trace-file)")
    ap.add_argument(
        "--role",
        choices=("validation", "held-apart", "selection", "selection-small", "selection-thin"),
        help="only the traces of this role",
    )
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--model", help="rl model zip (default: the shipped one)")
    ap.add_argument(
        "--rl-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the rl placement (repeatable), e.g. budget=0 or outlook=0.5; see its docstring",
    )
    ap.add_argument(
        "--trace-file",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="also run the bar on this trace (repeatable; role 'external'; sized like the bundled ones)",
    )
    ap.add_argument(
        "--columns",
        default="elasticflow",
        help="how --trace-file names its columns: ElasticFlow's (submission_time, duration, num_gpu, job_id, "
        "model_name), 'canonical' (gpufleet's trace schema), or ElasticFlow's with some renamed, as KEY=COLUMN "
        "pairs (KEY one of submit, duration, gpus, job_id, model), e.g. submit=submit_time",
    )
    ap.add_argument("--json", type=Path, help="also write every row here")
    args = ap.parse_args()
    if args.traces:
        names = args.traces.split(",")
    else:
        names = [] if args.trace_file and args.role is None else [c.name for c in CASES]
    if args.role == "selection":
        names = [c.name for c in SELECTION_CASES]
    if args.role == "selection-small":
        names = [c.name for c in SMALL_CASES]
    if args.role == "selection-thin":
        names = [c.name for c in THIN_CASES]
    known = CASES + SELECTION_CASES + SMALL_CASES + THIN_CASES
    cases = [c for c in known if c.name in names and (args.role is None or c.role == args.role)]
    cases += [TraceCase(p.stem, "external", str(p)) for p in args.trace_file]
    rl_opts = rl_options(args.rl_option)
    if args.model:
        rl_opts["model"] = args.model
    columns = trace_columns(args.columns)
    frames, verdicts = [], []
    for case in cases:
        try:
            frame = run_case(case, args.orders.split(","), args.placements.split(","), rl_opts, columns)
        except GpufleetError as exc:  # a bad trace file: one line that names it, no traceback
            raise SystemExit(f"{case.name}: {exc}") from None
        frames.append(frame)
        verdicts += report(frame)
    table = Table(title="the bar (network on)", header_style="bold")
    for col in ("trace", "check", "result"):
        table.add_column(col)
    for case, text, ok in verdicts:
        table.add_row(case, text, "met" if ok else "NOT met")
    console.print(table)
    if args.json and frames:
        pl.concat(frames).write_json(args.json)


if __name__ == "__main__":
    main()
