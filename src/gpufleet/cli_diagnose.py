"""``gpufleet diagnose``: thin command-line shells over :mod:`gpufleet.diagnose`.

``gpufleet diagnose TRACES`` analyses a folder of profiler traces (the default command, so the folder
comes right after ``diagnose``); ``gpufleet diagnose stragglers FILE`` scores per-step timings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

_DEFAULT = "analyze"


class _TracesByDefault(TyperGroup):
    """A group whose first argument, when it is not a subcommand, goes to the default ``analyze`` command."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
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

out = Console()
if not out.is_terminal:
    out = Console(width=160)
err = Console(stderr=True)


@diagnose_app.command(_DEFAULT, help="Analyse a folder of per-rank profiler traces (the default command).")
def analyze(
    traces: Annotated[Path, typer.Argument(help="Folder of per-rank traces (or one trace file).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the diagnosis as JSON (findings first).")] = False,
    report: Annotated[Path | None, typer.Option(help="Write an HTML report here.")] = None,
    top: Annotated[int, typer.Option(help="Show at most this many findings.")] = 10,
    show_all: Annotated[bool, typer.Option("--all", help="Also show findings below the alarm thresholds.")] = False,
    z: Annotated[float, typer.Option(help="Alarm threshold on the robust z-score.")] = 3.5,
    min_cost: Annotated[float, typer.Option(help="Alarm threshold on time lost, as a share of the median step.")] = (
        0.02
    ),
    localisers: Annotated[str | None, typer.Option(help="Comma-separated localisers to run (default: all).")] = None,
) -> None:
    from gpufleet.diagnose.analyzer import DEFAULT_LOCALISERS, TraceAnalyzer
    from gpufleet.diagnose.localize import Thresholds

    with err.status(f"reading traces in {traces} ...", spinner="dots"):
        analyzer = TraceAnalyzer(traces, Thresholds(z=z, cost_share=min_cost))
        names = tuple(n.strip() for n in localisers.split(",")) if localisers else DEFAULT_LOCALISERS
        diagnosis = analyzer.diagnose(names)
    shown = diagnosis.findings if show_all else diagnosis.alarms
    if as_json:
        payload = diagnosis.to_dict()
        payload["findings"] = [f.to_dict() for f in shown[:top]]
        print(json.dumps(payload, indent=2))
    else:
        _print_findings(diagnosis, shown[:top])
    if report is not None:
        from gpufleet.report.diagnose_report import write_diagnose_report

        path = write_diagnose_report(analyzer, diagnosis, report)
        err.print(f"report written to {path}")


def _print_findings(diagnosis, findings) -> None:
    out.print(f"{len(diagnosis.ranks)} rank(s), median step {diagnosis.step_s_median * 1e3:.2f} ms, "
              f"{len(diagnosis.alarms)} alarm(s)")
    for note in diagnosis.notes:
        out.print(f"[yellow]note:[/] {note}")
    if not findings:
        out.print("[green]No finding above the alarm thresholds.[/] (--all shows the rest)")
        return
    table = Table(title="Findings, by time lost per step")
    for col in ("rank", "category", "function", "ms/step", "score", "evidence"):
        table.add_column(col, justify="right" if col in ("ms/step", "score") else "left", overflow="fold")
    for f in findings:
        evidence = {k: v for k, v in f.evidence.items() if k not in ("top_functions", "extra_functions", "also")}
        table.add_row("all" if f.rank is None else str(f.rank), f.category, f.function[:60],
                      f"{f.cost_s_per_step * 1e3:.2f}", f"{f.score:.1f}",
                      ", ".join(f"{k}={v}" for k, v in evidence.items())[:120])
    out.print(table)


@diagnose_app.command("functions", help="Per-(rank, function) behaviour summary of a folder of traces.")
def functions(
    traces: Annotated[Path, typer.Argument(help="Folder of per-rank traces (or one trace file).")],
    rank: Annotated[int | None, typer.Option(help="Only this rank.")] = None,
    top: Annotated[int, typer.Option(help="Rows per rank, by total time.")] = 15,
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON.")] = False,
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
    table = Table(title="Functions by total time")
    cols = ("rank", "domain", "category", "function", "calls/step", "total s", "mean ms", "p95 ms", "cv", "share")
    for col in cols:
        table.add_column(col, overflow="fold")
    for r in summary.iter_rows(named=True):
        table.add_row(str(r["rank"]), r["domain"], r["category"], r["function"][:60], f"{r['calls_per_step']:.1f}",
                      f"{r['total_s']:.4f}", f"{r['mean_s'] * 1e3:.3f}", f"{r['p95_s'] * 1e3:.3f}",
                      f"{r['cv']:.2f}", f"{r['share_of_step']:.1%}")
    out.print(table)
