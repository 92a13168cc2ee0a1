"""A DeepShare-style job mix (:mod:`gpufleet.sim.mixes`) written as canonical Parquet, and its summary:
what ``gpufleet traces mix`` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.errors import TraceError

__all__ = ["mix_summary", "write_mix"]


def write_mix(
    out_path: Path,
    intensity: str = "heavy",
    jobs: int = 256,
    seed: int = 0,
    arrival: str = "batch",
    rate_per_h: float | None = None,
) -> dict[str, Any]:
    """Generate the mix, write it to ``out_path`` (must end in .parquet) and return :func:`mix_summary`."""
    from gpufleet.sim.mixes import default_rate_per_h, generate_mix, resolve_intensity
    from gpufleet.traces.convert import write_trace

    if not str(out_path).lower().endswith(".parquet"):
        raise TraceError(
            f"{out_path}: the mix is written as Parquet (it keeps the model column); "
            "give an output path ending in .parquet"
        )
    frame = generate_mix(intensity, jobs=jobs, seed=seed, arrival=arrival, rate_per_h=rate_per_h)
    path = write_trace(frame, out_path, format="parquet")
    rate = None
    if arrival == "poisson":
        rate = rate_per_h if rate_per_h is not None else default_rate_per_h(intensity, seed)
    return mix_summary(
        frame, intensity=resolve_intensity(intensity), seed=seed, arrival=arrival, rate_per_h=rate, path=str(path)
    )


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
