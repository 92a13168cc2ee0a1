"""The ``gpufleet`` command line: one Typer app whose subcommands are thin shells over library calls.

Heavy modules are imported inside the commands, so ``gpufleet --help`` stays fast. Errors a user can cause
(gpufleet's own exception types) print as one line and exit with status 2, without a traceback.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from gpufleet.errors import GpufleetError

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
traces_app = typer.Typer(help="Inspect, convert and generate job traces.", no_args_is_help=True)
app.add_typer(traces_app, name="traces")

out = Console()
if not out.is_terminal:  # piped output: do not squeeze tables into 80 columns
    out = Console(width=160)
err = Console(stderr=True)


# ---------------------------------------------------------------------------------------------- helpers
def _load_jobs(trace: str, columns: str | None, vc: str | None, reader: str | None, quiet: bool = False):
    from gpufleet.traces import load_trace, parse_columns

    mapping = parse_columns(columns) if columns else None
    load = load_trace(trace, reader=reader, columns=mapping, vc=vc)
    if load.rejected_total and not quiet:
        err.print(f"[yellow]warning:[/] {load.rejected_summary()}")
    return load


def _load_cluster(cluster: Path | None, gpus: int | None):
    from gpufleet.spec import load_cluster

    spec = load_cluster(cluster)
    if gpus is not None:
        if gpus <= 0:
            raise typer.BadParameter("--gpus must be positive")
        spec = spec.resized(gpus)
    return spec


def _clean(value: Any) -> Any:
    """JSON-safe values: NaN and infinity become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fmt_s(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _summary_table(results: list, title: str):
    from rich.table import Table

    table = Table(title=title, header_style="bold")
    for col in ("policy", "jobs", "avg JCT", "p99 JCT", "avg queue", "p95 queue", "GPU util", "makespan",
                "preempt.", "lost GPU-h", "wall"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        s = r.summary
        table.add_row(
            s["policy"], f"{s['finished']:,}/{s['jobs']:,}", _fmt_s(s["avg_jct_s"]), _fmt_s(s["p99_jct_s"]),
            _fmt_s(s["avg_queue_s"]), _fmt_s(s["p95_queue_s"]), f"{100 * s['gpu_util']:.1f} %",
            _fmt_s(s["makespan_s"]), f"{s['preemptions']:,}", f"{s['lost_work_gpu_h']:,.0f}", f"{s['wall_s']:.2f} s",
        )
    return table


# ---------------------------------------------------------------------------------------------- simulate
@app.command()
def simulate(
    trace: Annotated[str, typer.Option(help="'philly' (bundled) or a CSV / Parquet file of jobs.")] = "philly",
    columns: Annotated[str | None, typer.Option(
        help="Column mapping for a CSV: canonical=source pairs, e.g. "
        "'submit=submission_time,duration=duration,gpus=num_gpu'.")] = None,
    reader: Annotated[str | None, typer.Option(help="Force a trace reader: philly, csv or parquet.")] = None,
    vc: Annotated[str | None, typer.Option(help="Only the jobs of this virtual cluster.")] = None,
    cluster: Annotated[Path | None, typer.Option(help="Cluster TOML file (default: the bundled cluster).")] = None,
    gpus: Annotated[int | None, typer.Option(help="Resize the training pools to at least this many GPUs.")] = None,
    policy: Annotated[str, typer.Option(
        help="Comma-separated policies: fifo, sjf, srtf, las, tiresias (see `gpufleet policies`).")] = ",".join(
        ("fifo", "sjf", "srtf", "las", "tiresias")),
    opt: Annotated[list[str] | None, typer.Option(
        help="Policy option POLICY.KEY=VALUE, repeatable, e.g. tiresias.thresholds=3600,36000.")] = None,
    placement: Annotated[str, typer.Option(help="consolidate (fewest nodes, best fit) or spread.")] = "consolidate",
    strict_placement: Annotated[bool, typer.Option(
        help="Start multi-GPU jobs only on the fewest possible nodes (they wait otherwise).")] = False,
    placement_penalty: Annotated[float, typer.Option(
        help="Throughput lost by a job spread over more nodes than it needs (0.2 = 20 % slower).")] = 0.2,
    checkpoint_interval: Annotated[float, typer.Option(
        help="Seconds of progress between checkpoints; preemption loses the work since the last. "
        "0 (default): jobs checkpoint when preempted (suspend/resume) and lose nothing.")
    ] = 0.0,
    restart_cost: Annotated[float, typer.Option(help="Seconds a preempted job spends restoring on restart.")] = 60.0,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML report here.")] = None,
    jobs_out: Annotated[Path | None, typer.Option(
        help="Write every job's outcome (all policies) to this Parquet file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON (one object per policy).")] = False,
    breakdown: Annotated[str | None, typer.Option(help="Also print a per-'vc' or per-'size' breakdown.")] = None,
    workers: Annotated[int, typer.Option(help="Run policies in parallel over this many processes.")] = 1,
    ray: Annotated[bool, typer.Option("--ray", help="Run the policy sweep as tasks on a local Ray instance.")] = False,
    ray_address: Annotated[str | None, typer.Option(help="Run the sweep on this Ray cluster address.")] = None,
    debug: Annotated[bool, typer.Option(help="Check cluster invariants after every event (slow).")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar over simulated time.")] = True,
) -> None:
    """Replay a job trace on a cluster under scheduling policies and compare queueing, JCT and utilisation.

    With no options: the bundled Philly trace on the bundled 768-GPU cluster under fifo, sjf, srtf, las
    and tiresias. Ctrl-C stops a long run and reports what was simulated so far.
    """
    from gpufleet.sim.config import SimConfig
    from gpufleet.sim.run import parse_policy_opts, run_policies

    policies = [p.strip() for p in policy.split(",") if p.strip()]
    if not policies:
        raise typer.BadParameter("--policy names no policy")
    if breakdown not in (None, "vc", "size"):
        raise typer.BadParameter("--breakdown must be 'vc' or 'size'")
    load = _load_jobs(trace, columns, vc, reader)
    spec = _load_cluster(cluster, gpus)
    opts = parse_policy_opts(opt or [], policies)
    show_progress = progress and not as_json and err.is_terminal and workers <= 1 and not (ray or ray_address)
    config = SimConfig(placement=placement, strict_placement=strict_placement, placement_penalty=placement_penalty,
                       checkpoint_interval_s=checkpoint_interval, restart_s=restart_cost, debug=debug,
                       progress=show_progress)
    if not as_json:
        err.print(f"[bold]{load.jobs.height:,}[/] jobs from {load.source} on cluster "
                  f"'{spec.name}' ({spec.total_gpus():,} training GPUs); policies: {', '.join(policies)}")

    def done(r: Any) -> None:
        if not as_json:
            extra = " [yellow](interrupted)[/]" if r.meta.get("interrupted") else ""
            err.print(f"  {r.policy}: {r.summary['finished']:,} jobs finished in {r.summary['wall_s']:.2f} s{extra}")

    address = ray_address or ("local" if ray else None)
    results = run_policies(load.jobs, spec, policies, config, opts, workers=workers, ray_address=address,
                           on_done=done)
    unsched = results[0].meta.get("unschedulable", {}) if results else {}
    if unsched and not as_json:
        err.print("[yellow]warning:[/] jobs never scheduled: "
                  + "; ".join(f"{v:,} {k}" for k, v in unsched.items()))
    if as_json:
        rows = [{k: _clean(v) for k, v in r.summary.items()} for r in results]
        print(json.dumps(rows, indent=2))
    else:
        out.print(_summary_table(results, f"{load.source} on {spec.name} ({spec.total_gpus():,} GPUs)"))
        if breakdown:
            _print_breakdown(results, breakdown)
    if report is not None:
        from gpufleet.report import write_sim_report

        context = {"trace": str(load.source), "jobs": f"{load.jobs.height:,}", "cluster": spec.name,
                   "training GPUs": f"{spec.total_gpus():,}", "placement": placement,
                   "checkpoint interval": f"{checkpoint_interval:g} s", "restart cost": f"{restart_cost:g} s"}
        if vc:
            context["vc"] = vc
        path = write_sim_report(results, report, context=context)
        err.print(f"report written to {path}")
    if jobs_out is not None:
        import polars as pl

        frames = [r.jobs.with_columns(pl.lit(r.policy).alias("policy")) for r in results]
        jobs_out.parent.mkdir(parents=True, exist_ok=True)
        pl.concat(frames).write_parquet(jobs_out)
        err.print(f"job outcomes written to {jobs_out}")


def _print_breakdown(results: list, by: str) -> None:
    from rich.table import Table

    from gpufleet.report.breakdown import breakdown

    for r in results:
        frame = breakdown(r.jobs, by)
        table = Table(title=f"{r.policy}: by {by}", header_style="bold")
        for col in ("group", "jobs", "avg JCT", "avg queue", "p95 JCT"):
            table.add_column(col, justify="left" if col == "group" else "right")
        for row in frame.iter_rows(named=True):
            table.add_row(str(row["group"]), f"{row['jobs']:,}", _fmt_s(row["avg_jct_s"]),
                          _fmt_s(row["avg_queue_s"]), _fmt_s(row["p95_jct_s"]))
        out.print(table)


@app.command()
def policies() -> None:
    """List the scheduling policies and their options."""
    from rich.table import Table

    from gpufleet.sched.base import available_policies

    table = Table(header_style="bold")
    for col in ("policy", "preemptive", "what it does", "options (--opt policy.key=value)"):
        table.add_column(col)
    for name, cls in sorted(available_policies().items()):
        opts = ", ".join(f"{k}={v}" for k, v in cls.options.items()) or "—"
        table.add_row(name, "yes" if cls.preemptive else "no", cls.summary, opts)
    out.print(table)


# ---------------------------------------------------------------------------------------------- traces
@traces_app.command("info")
def traces_info(
    source: Annotated[str, typer.Argument(help="'philly' (bundled) or a CSV / Parquet file.")],
    columns: Annotated[str | None, typer.Option(help="Column mapping for a CSV (see `simulate --help`).")] = None,
    reader: Annotated[str | None, typer.Option(help="Force a reader: philly, csv or parquet.")] = None,
    vc: Annotated[str | None, typer.Option(help="Only this virtual cluster.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Rows, time span, GPU-demand histogram, durations and offered load of a trace."""
    from gpufleet.traces import trace_info

    load = _load_jobs(source, columns, vc, reader, quiet=as_json)
    info = trace_info(load)
    if as_json:
        print(json.dumps(info, indent=2, default=str))
        return
    _print_info(info)


def _print_info(info: dict[str, Any]) -> None:
    from rich.table import Table

    out.print(f"[bold]{info.get('source', '')}[/]")
    skip = {"gpu_histogram", "gpu_demand", "vcs", "per_vc", "duration_percentiles_s", "rejected",
            "rejected_examples"}
    table = Table(show_header=False)
    for key, value in info.items():
        if key in skip or isinstance(value, (dict, list)):
            continue
        table.add_row(key, f"{value:,.2f}" if isinstance(value, float) else str(value))
    out.print(table)
    for key, value in info.items():
        if isinstance(value, dict) and value:
            sub = Table(title=key, header_style="bold")
            first = next(iter(value.values()))
            if isinstance(first, dict):
                cols = list(first)
                sub.add_column(key.split("_")[0])
                for c in cols:
                    sub.add_column(c, justify="right")
                for k, row in value.items():
                    sub.add_row(str(k), *[f"{row[c]:,.3g}" if isinstance(row[c], float) else str(row[c])
                                          for c in cols])
            else:
                sub.add_column("key")
                sub.add_column("value", justify="right")
                for k, v in value.items():
                    sub.add_row(str(k), f"{v:,.4g}" if isinstance(v, float) else str(v))
            out.print(sub)


@traces_app.command("convert")
def traces_convert(
    source: Annotated[str, typer.Argument(help="'philly' (bundled) or a CSV / Parquet file.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output file (.parquet or .csv).")],
    fmt: Annotated[str | None, typer.Option("--format", help="Input format: philly, csv or parquet.")] = None,
    to: Annotated[str | None, typer.Option(help="Output format: parquet or csv (default: from the suffix).")] = None,
    columns: Annotated[str | None, typer.Option(help="Column mapping for a CSV (see `simulate --help`).")] = None,
    vc: Annotated[str | None, typer.Option(help="Only this virtual cluster.")] = None,
) -> None:
    """Convert a trace to gpufleet's canonical job schema (Parquet keeps the trace's start time)."""
    from gpufleet.traces import write_trace

    load = _load_jobs(source, columns, vc, fmt)
    path = write_trace(load, output, format=to)
    err.print(f"{load.jobs.height:,} jobs written to {path}")


@traces_app.command("generate")
def traces_generate(
    output: Annotated[Path, typer.Option("-o", "--output", help="Output file (.parquet or .csv).")],
    jobs: Annotated[int, typer.Option("-n", "--jobs", help="Number of jobs.")] = 100_000,
    gpus: Annotated[int | None, typer.Option(
        help="Cluster size the arrival rate is chosen for (with --load).")] = None,
    load: Annotated[float, typer.Option(help="Target average share of --gpus kept busy.")] = 0.8,
    rate: Annotated[float | None, typer.Option(help="Arrivals per hour (overrides --gpus/--load).")] = None,
    arrival: Annotated[str, typer.Option(help="poisson, or fitted (Philly's daily and weekly profile).")] = "poisson",
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same trace).")] = 0,
) -> None:
    """Generate a synthetic trace with Philly-fitted GPU mix and lognormal durations, for scale tests."""
    from gpufleet.traces import generate_jobs, write_trace

    target = load * gpus if gpus and rate is None else None
    frame = generate_jobs(jobs, seed=seed, arrival=arrival, rate_per_hour=rate, target_busy_gpus=target)
    path = write_trace(frame, output)
    span_d = float(frame["submit_s"].max()) / 86400 if frame.height else 0.0
    err.print(f"{frame.height:,} jobs over {span_d:.1f} days written to {path}")


def main() -> None:
    """Entry point: run the app, turning gpufleet's own errors into one line and exit status 2."""
    try:
        app()
    except GpufleetError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
