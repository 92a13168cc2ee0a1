"""The ``gpufleet`` command line: one Typer app, one thin module per sub-app (parse, call one library function,
print), and :mod:`gpufleet.cli.common` for what they share.

Heavy modules are imported inside the commands, so ``gpufleet --help`` stays fast. Errors a user can cause
(gpufleet's own exception types) print as one line and exit with status 2, without a traceback.
"""

from __future__ import annotations

import typer

from gpufleet.cli.common import RegistryHelp, run_app
from gpufleet.cli.contention import contention_app
from gpufleet.cli.diagnose import diagnose_app
from gpufleet.cli.health import health_app
from gpufleet.cli.meta import meta_app
from gpufleet.cli.perf import perf_app
from gpufleet.cli.perf import plan as perf_plan
from gpufleet.cli.sched import sched_app
from gpufleet.cli.serve import serve_app
from gpufleet.cli.simulate import policies, simulate
from gpufleet.cli.traces import traces_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="gpufleet",
    help="Tools for people who run large GPU clusters for deep learning.\n\n"
    "Start with `gpufleet simulate`: it replays the bundled Microsoft Philly trace (82k jobs) on the "
    "default cluster under every baseline scheduling policy and prints a comparison.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
)
app.command(cls=RegistryHelp)(simulate)
app.command()(policies)
app.command("plan", short_help="Alias of `gpufleet perf plan`: search every layout and rank those that fit.")(perf_plan)
app.add_typer(traces_app, name="traces")
app.add_typer(perf_app, name="perf")
app.add_typer(diagnose_app, name="diagnose")
app.add_typer(health_app, name="health")
app.add_typer(meta_app, name="meta")
app.add_typer(serve_app, name="serve")
app.add_typer(sched_app, name="sched")
app.add_typer(contention_app, name="contention")


def main() -> None:
    """Entry point: run the app, turning gpufleet's own errors into one line and exit status 2."""
    run_app(app)
