"""``gpufleet traces mix``: write a DeepShare-style job mix (:mod:`gpufleet.traces.mixes`) as canonical Parquet.

The command is attached to the ``traces`` sub-app by :func:`register`, so this module defines no app of
its own. NumPy, Polars and the contention model load inside the command, so ``gpufleet --help`` stays light.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpufleet.cli_console import err, out
from gpufleet.errors import TraceError

__all__ = ["Arrival", "mix_summary", "register", "traces_mix", "write_mix"]


class Arrival(StrEnum):
    """When the jobs arrive: all at t = 0 (DeepShare's traces) or as a Poisson stream."""

    batch = "batch"
    poisson = "poisson"


def write_mix(out_path: Path, intensity: str = "heavy", jobs: int = 256, seed: int = 0, arrival: str = "batch",
              rate_per_h: float | None = None) -> dict[str, Any]:
    """Generate the mix, write it to ``out_path`` (must end in .parquet) and return :func:`mix_summary`."""
    from gpufleet.traces.convert import write_trace
    from gpufleet.traces.mixes import default_rate_per_h, generate_mix, resolve_intensity

    if not str(out_path).lower().endswith(".parquet"):
        raise TraceError(f"{out_path}: the mix is written as Parquet (it keeps the model column); "
                         "give an output path ending in .parquet")
    frame = generate_mix(intensity, jobs=jobs, seed=seed, arrival=arrival, rate_per_h=rate_per_h)
    path = write_trace(frame, out_path, format="parquet")
    rate = None
    if arrival == "poisson":
        rate = rate_per_h if rate_per_h is not None else default_rate_per_h(intensity, seed)
    return mix_summary(frame, intensity=resolve_intensity(intensity), seed=seed, arrival=arrival,
                       rate_per_h=rate, path=str(path))


def mix_summary(frame: Any, **fields: Any) -> dict[str, Any]:
    """Counts per model and per GPU demand, GPU-hours and span of a mix frame, plus ``fields``."""
    import polars as pl

    gpu_h = float((frame["duration_s"] * frame["num_gpus"]).sum()) / 3600.0 if frame.height else 0.0
    models = frame.group_by("model").len().sort("model")
    demands = frame.group_by("num_gpus").len().sort("num_gpus")
    span_h = float(frame["submit_s"].max()) / 3600.0 if frame.height else 0.0
    return {
        **fields,
        "jobs": frame.height,
        "models": {str(m): int(n) for m, n in models.iter_rows()},
        "gpu_demand": {int(g): int(n) for g, n in demands.iter_rows()},
        "gpu_hours": gpu_h,
        "mean_duration_s": float(frame["duration_s"].mean()) if frame.height else 0.0,
        "last_submit_h": span_h,
        "multi_gpu_jobs": int(frame.filter(pl.col("num_gpus") > 1).height),
    }


def _print_summary(summary: dict[str, Any]) -> None:
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


def traces_mix(
    out_path: Annotated[Path, typer.Option("-o", "--out", help="Output Parquet file (keeps the model column).")],
    intensity: Annotated[str, typer.Option(
        help="Communication intensity of the model mix: light (low), medium (med), heavy, equal or random.")
    ] = "heavy",
    jobs: Annotated[int, typer.Option("-n", "--jobs", help="Number of jobs (DeepShare's traces: 256).")] = 256,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same trace).")] = 0,
    arrival: Annotated[Arrival, typer.Option(
        help="batch: every job at t = 0, as DeepShare; poisson: a constant-rate stream.")] = Arrival.batch,
    rate_per_h: Annotated[float | None, typer.Option(
        "--rate-per-h", help="Poisson arrivals per hour (default: the rate that offers 1.0 load on 32 GPUs, "
        "about 10 jobs/h).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Generate a DeepShare-style job mix: the six workloads of DeepShare's testbed by network intensity.

    Models are drawn with DeepShare's per-intensity weights (heavy: FSDP and MoE 0.25 each, the rest 0.125),
    GPU demand from {2, 4, 8}, and each job lasts as long as DeepShare's job of that type takes alone.
    Simulate it with `gpufleet simulate --network` on DeepShare's testbed, the cluster file
    `deepshare-testbed.toml` shipped in gpufleet/data/clusters (or `deepshare-64.toml`, 16 times larger).
    """
    summary = write_mix(out_path, intensity=intensity, jobs=jobs, seed=seed, arrival=str(arrival.value),
                        rate_per_h=rate_per_h)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    _print_summary(summary)
    rate = f" at {summary['rate_per_h']:.2f} jobs/h" if summary.get("rate_per_h") else " at t = 0"
    err.print(f"{summary['jobs']:,} jobs ({summary['intensity']}){rate} written to {summary['path']}")


def register(traces_app: typer.Typer) -> None:
    """Add ``mix`` to the ``gpufleet traces`` sub-app."""
    traces_app.command("mix")(traces_mix)
