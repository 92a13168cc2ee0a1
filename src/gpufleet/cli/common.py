"""What every sub-app of the command line shares: the two consoles (tables to stdout, messages to stderr), the
``--json`` and ``--wide`` options, JSON output, trace and cluster loading with their warnings, option help
listed from the plugin registries, and the one-line error handling of gpufleet's own exceptions."""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperCommand

from gpufleet.errors import GpufleetError
from gpufleet.report.fmt import clean_json

if TYPE_CHECKING:
    from gpufleet.spec import ClusterSpec
    from gpufleet.traces import TraceLoad

__all__ = [
    "HELP_LISTS",
    "JsonOpt",
    "RegistryHelp",
    "WideOpt",
    "err",
    "fill_help",
    "load_cluster",
    "load_jobs",
    "out",
    "print_json",
    "run_app",
]

out = Console()
if not out.is_terminal and "COLUMNS" not in os.environ:  # piped output: do not squeeze tables into 80 columns
    out = Console(width=160)
err = Console(stderr=True)

#: ``--json``: print machine-readable JSON instead of tables.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
#: ``--wide``: every column of a table, not only the ones that fit 100 columns.
WideOpt = Annotated[bool, typer.Option("--wide", help="Show every column of the tables (they need a wide terminal).")]


def _registry(module: str, attr: str) -> Any:
    return getattr(importlib.import_module(module), attr)


def _names(module: str, attr: str) -> Callable[[], str]:
    """``a, b, c``: the registered names (for kinds whose summaries have their own listing command)."""
    return lambda: ", ".join(_registry(module, attr).names())


def _summaries(module: str, attr: str) -> Callable[[], str]:
    """``a: what a does; b: ...``: each registered name with its one-line summary (as ``Registry.help_text``)."""

    def text() -> str:
        items = _registry(module, attr).summaries().items()
        return "; ".join(f"{name}: {summary.rstrip('.')}" if summary else name for name, summary in items)

    return text


def _policies_needing(need: str) -> Callable[[], str]:
    def text() -> str:
        from gpufleet.sched.policy import POLICIES, policies_needing

        return ", ".join(policies_needing(need, POLICIES.names()))

    return text


#: ``{name}`` placeholders that option help may hold, filled from the plugin registries when the help is shown
#: (:class:`RegistryHelp`), so that a new plugin appears in ``--help`` with no edit here. Filling imports the
#: registry's package (the health models import torch), which is why it waits for ``--help``.
HELP_LISTS: dict[str, Callable[[], str]] = {
    "policies": _names("gpufleet.sched.policy", "POLICIES"),
    "network-policies": _policies_needing("network"),
    "placements": _summaries("gpufleet.sched.placement.base", "PLACEMENTS"),
    "trace-readers": _summaries("gpufleet.traces.readers", "READERS"),
    "telemetry-readers": _summaries("gpufleet.health.readers", "READERS"),
    "health-models": _summaries("gpufleet.health.models.base", "MODELS"),
    "localisers": _summaries("gpufleet.diagnose.localize", "LOCALISERS"),
    "inference-sources": _summaries("gpufleet.traces.inference", "SOURCES"),
}
_PLACEHOLDER = re.compile(r"\{(" + "|".join(re.escape(k) for k in HELP_LISTS) + r")\}")


def fill_help(text: str) -> str:
    """``text`` with every :data:`HELP_LISTS` placeholder replaced by the registry's current listing."""
    return _PLACEHOLDER.sub(lambda m: HELP_LISTS[m.group(1)](), text)


class RegistryHelp(TyperCommand):
    """A command whose option help may name registry listings (``{policies}``), filled only when help is shown."""

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:  # typer vendors click: no `import click`
        for param in self.params:
            help_text = getattr(param, "help", None)
            if help_text and _PLACEHOLDER.search(help_text):
                param.help = fill_help(help_text)  # type: ignore[attr-defined]
        super().format_help(ctx, formatter)


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
