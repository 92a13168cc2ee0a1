"""What every sub-app of the command line shares: the two consoles (tables to stdout, messages to stderr), the
``--json`` and ``--wide`` options, JSON output, trace and cluster loading with their warnings, and the one-line
error handling of gpufleet's own exceptions."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from gpufleet.errors import GpufleetError
from gpufleet.report.fmt import clean_json

if TYPE_CHECKING:
    from gpufleet.spec import ClusterSpec
    from gpufleet.traces import TraceLoad

__all__ = ["JsonOpt", "WideOpt", "err", "load_cluster", "load_jobs", "out", "print_json", "run_app"]

out = Console()
if not out.is_terminal and "COLUMNS" not in os.environ:  # piped output: do not squeeze tables into 80 columns
    out = Console(width=160)
err = Console(stderr=True)

#: ``--json``: print machine-readable JSON instead of tables.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
#: ``--wide``: every column of a table, not only the ones that fit 100 columns.
WideOpt = Annotated[bool, typer.Option("--wide", help="Show every column of the tables (they need a wide terminal).")]


def print_json(data: Any, indent: int = 2) -> None:
    """``data`` as JSON on stdout, NaN and infinity as null (:func:`gpufleet.report.fmt.clean_json`)."""
    print(json.dumps(clean_json(data), indent=indent, default=str))


def load_jobs(trace: str, columns: str | None, vc: str | None, reader: str | None, quiet: bool = False) -> TraceLoad:
    """A job trace with its column mapping; a warning on stderr counts the rows it rejected."""
    from gpufleet.traces import load_trace, parse_columns

    mapping = parse_columns(columns) if columns else None
    load = load_trace(trace, reader=reader, columns=mapping, vc=vc)
    if load.rejected_total and not quiet:
        err.print(f"[yellow]warning:[/] {load.rejected_summary()}")
    return load


def load_cluster(cluster: Path | None, gpus: int | None) -> ClusterSpec:
    """A cluster file or bundled name (None: the bundled default), resized to ``gpus`` training GPUs if given."""
    from gpufleet.spec import load_cluster as load_spec

    spec = load_spec(cluster)
    if gpus is not None:
        if gpus <= 0:
            raise typer.BadParameter("--gpus must be positive")
        spec = spec.resized(gpus)
    return spec


def run_app(app: typer.Typer) -> None:
    """Run ``app``, turning gpufleet's own errors into one red line on stderr and exit status 2."""
    try:
        app()
    except GpufleetError as exc:
        from rich.markup import escape

        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
