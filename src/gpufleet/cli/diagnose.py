"""``gpufleet diagnose``: thin command-line shells over :mod:`gpufleet.diagnose`.

``gpufleet diagnose TRACES`` analyses a folder of profiler traces (the default command, so the folder
comes right after ``diagnose``); ``gpufleet diagnose stragglers FILE`` scores per-step timings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from typer.core import TyperGroup

from gpufleet.cli.common import RegistryHelp, WideOpt, err, out

_DEFAULT = "analyze"
#: Widest a function name is shown without ``--wide`` (longer ones fold onto more lines): the tables fit 100 columns.
_FUNCTION_WIDTH = 40
#: The same in ``diagnose functions``, whose table has more columns.
_FUNCTION_TABLE_WIDTH = 32
#: Columns of ``diagnose functions`` shown without ``--wide``.
_DEFAULT_FUNCTION_COLUMNS = ("rank", "category", "function", "calls/step", "total s", "share")
#: Columns of ``diagnose stragglers`` shown without ``--wide``.
_DEFAULT_STRAGGLER_COLUMNS = ("section", "rank", "median", "relative", "z", "straggler", "slow from step", "slowdown")


class _TracesByDefault(TyperGroup):
    """A group whose first argument, when it is not a subcommand, goes to the default ``analyze`` command."""

    def resolve_command(self, ctx: typer.Context, args: list[str]):  # typer vendors click: no `import click`
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args.insert(0, _DEFAULT)
        return super().resolve_command(ctx, args)


diagnose_app = typer.Typer(
    cls=_TracesByDefault,
    help="Find why a distributed training job is slow.\n\n"
    "`gpufleet diagnose TRACES/` reads a folder of per-rank PyTorch profiler traces (.json / .json.gz) and "
    "ranks findings: which rank, which function, which resource, how much time per step. "
    "`gpufleet diagnose stragglers timings.csv` scores per-step timings (cheap enough to run always).",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


@diagnose_app.command(
    _DEFAULT, cls=RegistryHelp, help="Analyse a folder of per-rank profiler traces (the default command)."
)
def analyze(
    traces: Annotated[Path, typer.Argument(help="Folder of per-rank traces (or one trace file).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the diagnosis as JSON (findings first).")] = False,
    report: Annotated[Path | None, typer.Option(help="Write an HTML report here.")] = None,
    top: Annotated[int, typer.Option(help="Show at most this many findings.")] = 10,
    show_all: Annotated[bool, typer.Option("--all", help="Also show findings below the alarm thresholds.")] = False,
    z: Annotated[float, typer.Option(help="Alarm threshold on the robust z-score.")] = 3.5,
    min_cost: Annotated[float, typer.Option(help="Alarm threshold on time lost, as a share of the median step.")] = (
        0.08
    ),
    localisers: Annotated[
        str | None,
        typer.Option(help="Comma-separated localisers to run (default: every default one): {localisers}."),
    ] = None,
    wide: WideOpt = False,
) -> None:
    from gpufleet.diagnose.analyzer import TraceAnalyzer
    from gpufleet.diagnose.localize import Thresholds, default_localisers

    with err.status(f"reading traces in {traces} ...", spinner="dots"):
        analyzer = TraceAnalyzer(traces, Thresholds(z=z, cost_share=min_cost))
        names = tuple(n.strip() for n in localisers.split(",")) if localisers else default_localisers()
        diagnosis = analyzer.diagnose(names)
    shown = diagnosis.findings if show_all else diagnosis.alarms
    if as_json:
        payload = diagnosis.to_dict()
        payload["findings"] = [f.to_dict() for f in shown[:top]]
        print(json.dumps(payload, indent=2))
    else:
        _print_findings(diagnosis, shown[:top], wide)
    if report is not None:
        from gpufleet.report.diagnose_report import write_diagnose_report

        path = write_diagnose_report(analyzer, diagnosis, report)
        err.print(f"report written to {path}")


def _print_findings(diagnosis, findings, wide: bool = False) -> None:
    out.print(
        f"{len(diagnosis.ranks)} rank(s), median step {diagnosis.step_s_median * 1e3:.2f} ms, "
        f"{len(diagnosis.alarms)} alarm(s)"
    )
    for note in diagnosis.notes:
        out.print(f"[yellow]note:[/] {note}")
    if not findings:
        out.print("[green]No finding above the alarm thresholds.[/] (--all shows the rest)")
        return
    table = Table(title="Findings, by time lost per step", caption=None if wide else "--wide adds the evidence")
    for col in ("rank", "category", "function", "ms/step", "score", "evidence")[: None if wide else -1]:
        table.add_column(
            col,
            justify="right" if col in ("ms/step", "score") else "left",
            overflow="fold",
            no_wrap=col in ("ms/step", "score"),
            max_width=None if wide or col != "function" else _FUNCTION_WIDTH,
        )
    for f in findings:
        evidence = {k: v for k, v in f.evidence.items() if k not in ("top_functions", "extra_functions", "also")}
        row = [
            "all" if f.rank is None else str(f.rank),
            f.category,
            f.function[:60],
            f"{f.cost_s_per_step * 1e3:.2f}",
            f"{f.score:.1f}",
        ]
        if wide:
            row.append(", ".join(f"{k}={v}" for k, v in evidence.items())[:120])
        table.add_row(*row)
    out.print(table)


@diagnose_app.command(
    "diff",
    help="Compare two runs of the same job: functions and kernels added, removed, slower or faster, and which "
    "differences explain the step-time change.",
)
def diff(
    control: Annotated[Path, typer.Argument(help="Folder of the control run's per-rank traces (yesterday's).")],
    test: Annotated[Path, typer.Argument(help="Folder of the test run's per-rank traces (today's).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the diff as JSON.")] = False,
    report: Annotated[Path | None, typer.Option(help="Write an HTML report here.")] = None,
    top: Annotated[int, typer.Option(help="Show at most this many changed functions.")] = 15,
    show_all: Annotated[bool, typer.Option("--all", help="Also list functions whose time did not change.")] = False,
    wide: WideOpt = False,
) -> None:
    import polars as pl

    from gpufleet.diagnose.diff import diff_runs

    with err.status(f"reading {control} and {test} ...", spinner="dots"):
        result = diff_runs(control, test)
    ops = result.ops if show_all else result.ops.filter(pl.col("change") != "same")
    ops = ops.sort(pl.col("delta_s_per_step").abs(), descending=True)
    if as_json:
        payload = result.to_dict()
        payload["ops"] = ops.head(top).to_dicts()
        print(json.dumps(payload, indent=2, default=str))
    else:
        _print_diff(result, ops.head(top), wide)
    if report is not None:
        from gpufleet.report.diagnose_diff_report import write_diff_report

        path = write_diff_report(result, report, control=str(control), test=str(test))
        err.print(f"report written to {path}")


def _print_diff(result, ops, wide: bool) -> None:
    change = result.step_change_s
    share = change / result.control_step_s if result.control_step_s else 0.0
    out.print(
        f"mean step {result.control_step_s * 1e3:.2f} ms -> {result.test_step_s * 1e3:.2f} ms "
        f"({change * 1e3:+.2f} ms, {share:+.1%})"
    )
    for note in result.notes:
        out.print(f"[yellow]note:[/] {note}")
    explained = result.explain.filter(explain_col := result.explain["explains"])
    if explain_col.any():
        t = Table(title="Explained by (self time on the training thread, per step)")
        for col in ("function", "category", "change ms", "share"):
            t.add_column(col, justify="left" if col in ("function", "category") else "right", overflow="fold",
                         max_width=None if wide or col != "function" else _FUNCTION_WIDTH)  # fmt: skip
        for r in explained.iter_rows(named=True):
            t.add_row(r["function"], r["category"], f"{r['delta_s_per_step'] * 1e3:+.2f}",
                      f"{r['share_of_step_change']:.0%}")  # fmt: skip
        out.print(t)
    if ops.is_empty():
        out.print("[green]No function or kernel changed its time per step.[/] (--all lists them all)")
        return
    t = Table(title="Functions and kernels that changed, per step (HTA TraceDiff's counts)")
    for col in ("function", "change", "calls", "control ms", "test ms", "change ms"):
        t.add_column(col, justify="left" if col in ("function", "change") else "right", overflow="fold",
                     max_width=None if wide or col != "function" else _FUNCTION_WIDTH)  # fmt: skip
    for r in ops.iter_rows(named=True):
        calls = f"{r['control_calls_per_step']:.4g}->{r['test_calls_per_step']:.4g}"
        t.add_row(("[kernel] " if r["device"] else "") + r["function"], r["change"], calls,
                  f"{r['control_s_per_step'] * 1e3:.3f}", f"{r['test_s_per_step'] * 1e3:.3f}",
                  f"{r['delta_s_per_step'] * 1e3:+.3f}")  # fmt: skip
    out.print(t)


@diagnose_app.command("functions", help="Per-(rank, function) behaviour summary of a folder of traces.")
def functions(
    traces: Annotated[Path, typer.Argument(help="Folder of per-rank traces (or one trace file).")],
    rank: Annotated[int | None, typer.Option(help="Only this rank.")] = None,
    top: Annotated[int, typer.Option(help="Rows per rank, by total time.")] = 15,
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON.")] = False,
    wide: WideOpt = False,
) -> None:
    import polars as pl

    from gpufleet.diagnose.analyzer import TraceAnalyzer

    summary = TraceAnalyzer(traces).function_summary()
    if rank is not None:
        summary = summary.filter(pl.col("rank") == rank)
    summary = summary.sort(["rank", "total_s"], descending=[False, True])
    summary = summary.group_by("rank", maintain_order=True).head(top)
    if as_json:
        print(json.dumps(summary.to_dicts(), indent=2, default=str))
        return
    cols = ("rank", "domain", "category", "function", "calls/step", "total s", "mean ms", "p95 ms", "cv", "share")
    keep = [i for i, c in enumerate(cols) if wide or c in _DEFAULT_FUNCTION_COLUMNS]
    hidden = len(cols) - len(keep)
    table = Table(
        title="Functions by total time", caption=f"--wide shows every column ({hidden} more)" if hidden else None
    )
    for i in keep:
        narrow = cols[i] == "function" and not wide
        table.add_column(cols[i], overflow="fold", max_width=_FUNCTION_TABLE_WIDTH if narrow else None)
    for r in summary.iter_rows(named=True):
        row = (
            str(r["rank"]),
            r["domain"],
            r["category"],
            r["function"][:60],
            f"{r['calls_per_step']:.1f}",
            f"{r['total_s']:.4f}",
            f"{r['mean_s'] * 1e3:.3f}",
            f"{r['p95_s'] * 1e3:.3f}",
            f"{r['cv']:.2f}",
            f"{r['share_of_step']:.1%}",
        )
        table.add_row(*(row[i] for i in keep))
    out.print(table)


@diagnose_app.command(
    "breakdown",
    help="GPU time of each rank as HTA reports it: idle / compute / non-compute, "
    "communication-computation overlap, late-starting collective (straggler).",
)
def breakdown(
    traces: Annotated[Path, typer.Argument(help="Folder of per-rank traces (or one trace file).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the tables as JSON.")] = False,
) -> None:
    from gpufleet.diagnose.gpu_time import comm_comp_overlap, temporal_breakdown
    from gpufleet.diagnose.kineto import read_folder
    from gpufleet.diagnose.late_start import late_start_stragglers
    from gpufleet.errors import DiagnoseError

    events = read_folder(traces).events
    table = temporal_breakdown(events).join(comm_comp_overlap(events), on="rank", how="left")
    note = ""
    try:
        candidates = late_start_stragglers(events).candidates
    except DiagnoseError as exc:  # no collective kernels: nothing to rank
        candidates, note = [], str(exc)
    if as_json:
        print(json.dumps({"ranks": table.to_dicts(), "late_start_candidates": candidates}, indent=2, default=str))
        return
    t = Table(title="GPU time per rank (HTA definitions)")
    for col in ("rank", "idle %", "compute %", "non-compute %", "comm overlapped by compute %"):
        t.add_column(col, justify="right")
    for r in table.iter_rows(named=True):
        ov = r.get("overlap_pct")
        t.add_row(
            str(r["rank"]),
            f"{r['idle_pct']:.1f}",
            f"{r['compute_pct']:.1f}",
            f"{r['non_compute_pct']:.1f}",
            "-" if ov is None else f"{ov:.1f}",
        )
    out.print(t)
    out.print(f"late-start straggler candidates: {candidates or 'none'} {note}")


@diagnose_app.command("stragglers", help="Straggler ranks over time from per-step timings (CSV or Parquet).")
def stragglers(
    timings: Annotated[Path, typer.Argument(help="Per-(rank, step[, section]) durations, long or wide format.")],
    columns: Annotated[str | None, typer.Option(help="Column mapping, e.g. rank=worker,step=time,duration=t.")] = None,
    threshold: Annotated[float, typer.Option(help="Relative score below which a rank straggles (NVRx: 0.75).")] = 0.75,
    window: Annotated[int | None, typer.Option(help="Steps per scoring window (default: about 1/20 of the run).")] = (
        None
    ),
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    wide: WideOpt = False,
) -> None:
    from gpufleet.diagnose.stragglers import detect_stragglers, parse_columns, read_timings

    with err.status(f"scoring {timings} ...", spinner="dots"):
        frame = read_timings(timings, parse_columns(columns))
        report = detect_stragglers(frame, threshold=threshold, window=window)
    if as_json:
        print(json.dumps(report.to_dict(windows=False), indent=2, default=str))
        return
    for note in report.notes:
        out.print(f"[yellow]note:[/] {note}")
    found = report.stragglers
    out.print(
        f"{frame['rank'].n_unique()} ranks, {frame['step'].n_unique()} steps, "
        f"{found.height} straggler(s) at threshold {threshold}"
    )
    cols = (
        "section",
        "rank",
        "median",
        "relative",
        "individual",
        "z",
        "straggler",
        "slow from step",
        "recovered",
        "slowdown",
    )
    keep = [i for i, c in enumerate(cols) if wide or c in _DEFAULT_STRAGGLER_COLUMNS]
    hidden = len(cols) - len(keep)
    t = Table(
        title="Stragglers first, then ranks by relative score (1.0 = as fast as the fastest)",
        caption=f"--wide shows every column ({hidden} more)" if hidden else None,
    )
    for i in keep:
        section = cols[i] == "section"
        t.add_column(
            cols[i],
            justify="left" if section else "right",
            overflow="fold" if section else "ellipsis",
            no_wrap=not section,
            max_width=None if wide or not section else 20,
        )

    def fmt(v, spec=".3f"):
        return "-" if v is None or v != v else format(v, spec)

    rows = report.ranks.sort(["is_straggler", "relative_score"], descending=[True, False]).head(20)
    for r in rows.iter_rows(named=True):
        row = (
            str(r["section"]),
            str(r["rank"]),
            fmt(r["median_s"], ".4g"),
            fmt(r["relative_score"]),
            fmt(r["individual_score"]),
            fmt(r["z"], ".1f"),
            "yes" if r["is_straggler"] else "",
            fmt(r["first_slow_step"], "d") if r["first_slow_step"] is not None else "-",
            fmt(r["recovered_step"], "d") if r["recovered_step"] is not None else "-",
            fmt(r["slowdown"], ".2f"),
        )
        t.add_row(*(row[i] for i in keep))
    out.print(t)
