"""``gpufleet traces``: inspect, convert and generate job traces, DeepShare-style mixes and inference loads.

Each command reads its options, calls one function of :mod:`gpufleet.traces` and prints the result.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpufleet.cli.common import RegistryHelp, err, load_cluster, load_jobs, out
from gpufleet.report.fmt import clean_json, format_span

__all__ = ["traces_app"]

traces_app = typer.Typer(help="Inspect, convert and generate job traces.", no_args_is_help=True)


class Arrival(StrEnum):
    """When the jobs arrive: all at t = 0 (DeepShare's traces) or as a Poisson stream."""

    batch = "batch"
    poisson = "poisson"


@traces_app.command("info", cls=RegistryHelp)
def traces_info(
    source: Annotated[str, typer.Argument(help="'philly' (bundled) or a CSV / Parquet file.")],
    columns: Annotated[str | None, typer.Option(help="Column mapping for a CSV (see `simulate --help`).")] = None,
    reader: Annotated[str | None, typer.Option(help="Force a reader: {trace-readers}.")] = None,
    vc: Annotated[str | None, typer.Option(help="Only this virtual cluster.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Rows, time span, GPU-demand histogram, durations and offered load of a trace."""
    from gpufleet.traces import trace_info

    load = load_jobs(source, columns, vc, reader, quiet=as_json)
    info = trace_info(load)
    if as_json:
        print(json.dumps(info, indent=2, default=str))
        return
    _print_info(info)


def _print_info(info: dict[str, Any]) -> None:
    out.print(f"[bold]{info.get('source', '')}[/]")
    skip = {"gpu_histogram", "gpu_demand", "vcs", "per_vc", "duration_percentiles_s", "rejected", "rejected_examples"}
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
                    sub.add_row(str(k), *[f"{row[c]:,.3g}" if isinstance(row[c], float) else str(row[c]) for c in cols])
            else:
                sub.add_column("key")
                sub.add_column("value", justify="right")
                for k, v in value.items():
                    sub.add_row(str(k), f"{v:,.4g}" if isinstance(v, float) else str(v))
            out.print(sub)


@traces_app.command("convert", cls=RegistryHelp)
def traces_convert(
    source: Annotated[str, typer.Argument(help="'philly' (bundled) or a CSV / Parquet file.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output file (.parquet or .csv).")],
    fmt: Annotated[str | None, typer.Option("--format", help="Input reader: {trace-readers}.")] = None,
    to: Annotated[str | None, typer.Option(help="Output format: parquet or csv (default: from the suffix).")] = None,
    columns: Annotated[str | None, typer.Option(help="Column mapping for a CSV (see `simulate --help`).")] = None,
    vc: Annotated[str | None, typer.Option(help="Only this virtual cluster.")] = None,
) -> None:
    """Convert a trace to gpufleet's canonical job schema (Parquet keeps the trace's start time)."""
    from gpufleet.traces import write_trace

    load = load_jobs(source, columns, vc, fmt)
    path = write_trace(load, output, format=to)
    err.print(f"{load.jobs.height:,} jobs written to {path}")


@traces_app.command("generate")
def traces_generate(
    output: Annotated[Path, typer.Option("-o", "--output", help="Output file (.parquet or .csv).")],
    jobs: Annotated[int, typer.Option("-n", "--jobs", help="Number of jobs.")] = 100_000,
    gpus: Annotated[int | None, typer.Option(help="Cluster size the arrival rate is chosen for (with --load).")] = None,
    load: Annotated[
        float,
        typer.Option(
            help="Share of --gpus kept busy on average between the first and last submission; durations are "
            "resampled to at most 0.49 of that window, as in Philly (docs/traces.md)."
        ),
    ] = 0.8,
    rate: Annotated[float | None, typer.Option(help="Arrivals per hour (overrides --gpus/--load).")] = None,
    arrival: Annotated[
        str | None,
        typer.Option(
            help="poisson, or fitted (Philly's daily and weekly profile). Default: fitted with --gpus (its peaks "
            "queue jobs; flat Poisson arrivals at 80 % load never queue on a large cluster), else poisson."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same trace).")] = 0,
) -> None:
    """Generate a synthetic trace with Philly-fitted GPU mix and lognormal durations, for scale tests."""
    from gpufleet.traces import generate_jobs, write_trace

    target = load * gpus if gpus and rate is None else None
    if arrival is None:
        arrival = "fitted" if target is not None else "poisson"
    frame = generate_jobs(jobs, seed=seed, arrival=arrival, rate_per_hour=rate, target_busy_gpus=target)
    path = write_trace(frame, output)
    span_d = float(frame["submit_s"].max()) / 86400 if frame.height else 0.0
    err.print(f"{frame.height:,} jobs over {span_d:.1f} days written to {path}")


@traces_app.command("inference", cls=RegistryHelp)
def traces_inference(
    source: Annotated[
        str,
        typer.Argument(help="{inference-sources}; or a CSV with columns time,servers_needed."),
    ],
    cluster: Annotated[
        Path | None,
        typer.Option(help="Cluster TOML; its inference pools' nodes are the pool (default: the bundled cluster)."),
    ] = None,
    days: Annotated[float, typer.Option(help="Days of load to build and summarise.")] = 14.0,
    headroom: Annotated[
        float | None, typer.Option(help="genai only: spare capacity kept above the busy GPUs [default: 0.2].")
    ] = None,
    step: Annotated[float | None, typer.Option(help="genai, diurnal: seconds per step [default: 300].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    csv_out: Annotated[
        Path | None, typer.Option("--csv", help="Write the steps (time_s, servers_needed, idle_servers) to this CSV.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write an HTML chart of servers needed and idle over time, and by hour of day.")
    ] = None,
) -> None:
    """Servers the inference pool needs over time and how many sit idle (loanable to training, as in Aryl).

    Examples: `gpufleet traces inference genai`, `gpufleet traces inference diurnal --days 7 --json`,
    `gpufleet traces inference my_load.csv --plot load.html`.
    """
    from gpufleet.traces.pool_load import pool_load

    if not (math.isfinite(days) and days > 0):
        raise typer.BadParameter("--days must be a positive number")
    spec = load_cluster(cluster, None)
    summary, frame = pool_load(source, spec, days, headroom=headroom, step=step)
    if csv_out is not None:
        csv_out.parent.mkdir(parents=True, exist_ok=True)
        frame.write_csv(csv_out)
        err.print(f"{frame.height:,} steps written to {csv_out}")
    if plot is not None:
        from gpufleet.report.inference_plot import write_inference_plot

        write_inference_plot(plot, frame, summary, days * 86400.0)
        err.print(f"chart written to {plot}")
    if as_json:
        print(json.dumps(clean_json(summary), indent=2))
        return
    _print_inference(summary)


def _print_inference(s: dict[str, Any]) -> None:
    table = Table(title=f"inference load '{s['name']}' on {s['cluster']}", show_header=False)
    rows = [
        ("pool", f"{s['pool_servers']:,} servers"),
        ("span", format_span(s["end_s"] - s["start_s"])),
        ("steps", f"{s['steps']:,}"),
        ("mean utilisation", f"{100 * s['mean_utilisation']:.1f} %"),
        ("peak utilisation", f"{100 * s['peak_utilisation']:.1f} %"),
        ("trough utilisation", f"{100 * s['trough_utilisation']:.1f} %"),
        ("mean servers needed", f"{s['mean_servers_needed']:,.1f}"),
        ("mean idle servers", f"{s['mean_idle_servers']:,.1f}"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)
    blocks = "▁▂▃▄▅▆▇█"
    hourly = Table(title="mean utilisation by hour of day (bars: 0-100 %)", header_style="bold")
    for col in ("hours", "", "utilisation"):
        hourly.add_column(col)
    for first in range(0, 24, 6):
        values = s["hourly_utilisation"][first : first + 6]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        bar = "".join(blocks[min(7, int(v * 8))] if v is not None and math.isfinite(v) else "·" for v in values)
        text = "  ".join(f"{100 * v:3.0f}%" if v is not None and math.isfinite(v) else "   —" for v in values)
        hourly.add_row(f"{first:02d}-{first + 5:02d}", bar if finite else "", text)
    out.print(hourly)


def _print_mix(summary: dict[str, Any]) -> None:
    table = Table(title=f"{summary['intensity']} mix, seed {summary['seed']}", header_style="bold")
    table.add_column("model")
    table.add_column("jobs", justify="right")
    table.add_column("share", justify="right")
    total = max(summary["jobs"], 1)
    for model, n in summary["models"].items():
        table.add_row(model, f"{n:,}", f"{100 * n / total:.1f} %")
    out.print(table)
    demand = ", ".join(f"{g} GPUs: {n:,}" for g, n in summary["gpu_demand"].items())
    out.print(f"GPU demand: {demand}; {summary['gpu_hours']:,.1f} GPU-hours in all")


@traces_app.command("mix")
def traces_mix(
    out_path: Annotated[Path, typer.Option("-o", "--out", help="Output Parquet file (keeps the model column).")],
    intensity: Annotated[
        str,
        typer.Option(
            help="Communication intensity of the model mix: light (low), medium (med), heavy, equal or random."
        ),
    ] = "heavy",
    jobs: Annotated[int, typer.Option("-n", "--jobs", help="Number of jobs (DeepShare's traces: 256).")] = 256,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same trace).")] = 0,
    arrival: Annotated[
        Arrival, typer.Option(help="batch: every job at t = 0, as DeepShare; poisson: a constant-rate stream.")
    ] = Arrival.batch,
    rate_per_h: Annotated[
        float | None,
        typer.Option(
            "--rate-per-h",
            help="Poisson arrivals per hour (default: the rate that offers 1.0 load on 32 GPUs, about 10 jobs/h).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Generate a DeepShare-style job mix: the six workloads of DeepShare's testbed by network intensity.

    Models are drawn with DeepShare's per-intensity weights (heavy: FSDP and MoE 0.25 each, the rest 0.125),
    GPU demand from {2, 4, 8}, and each job lasts as long as DeepShare's job of that type takes alone.
    Simulate it with `gpufleet simulate --network` on DeepShare's testbed, the cluster file
    `deepshare-testbed.toml` shipped in gpufleet/data/clusters (or `deepshare-64.toml`, 16 times larger).
    """
    from gpufleet.sim.mix_file import write_mix

    summary = write_mix(
        out_path, intensity=intensity, jobs=jobs, seed=seed, arrival=str(arrival.value), rate_per_h=rate_per_h
    )
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    _print_mix(summary)
    rate = f" at {summary['rate_per_h']:.2f} jobs/h" if summary.get("rate_per_h") else " at t = 0"
    err.print(f"{summary['jobs']:,} jobs ({summary['intensity']}){rate} written to {summary['path']}")
