"""Failure and alert events from telemetry: what the simulator's ``--failures`` / ``--predictor`` take from ``health``.

Both frame functions return plain Polars frames with times in seconds since the fleet's first sample, so the
simulator needs nothing else from ``health``: ``gpufleet.sim.fleet_failures``, where the two meet, imports
only this module (an import-linter contract in ``pyproject.toml`` holds it there).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health import xid


def failure_events(fleet: str | Path) -> pl.DataFrame:
    """Hard-XID failures in a canonical telemetry file: gpu, node, time_s, xid (sorted by time)."""
    path = Path(fleet)
    if not path.exists():
        raise HealthError(f"{path}: no such telemetry file")
    schema = pl.read_parquet_schema(path)
    if "DCGM_FI_DEV_XID_ERRORS" not in schema:
        raise HealthError(
            f"{path}: no DCGM_FI_DEV_XID_ERRORS column, so no failure can be found; "
            "merge kernel-log XIDs with `gpufleet health import --xid`"
        )
    lazy = pl.scan_parquet(path)
    start = lazy.select(pl.col("time").min()).collect().item()
    return (
        lazy.filter(pl.col("DCGM_FI_DEV_XID_ERRORS").is_in(sorted(xid.HARD_XIDS)))
        .select(
            pl.col("gpu").cast(pl.UInt32),
            pl.col("node").cast(pl.UInt32),
            time_s=(pl.col("time") - pl.lit(start)).dt.total_milliseconds() / 1000.0,
            xid=pl.col("DCGM_FI_DEV_XID_ERRORS").cast(pl.Int64),
        )
        .sort("time_s")
        .collect()
    )


def predicted_alerts(model: str | Path, fleet: str | Path) -> pl.DataFrame:
    """The alerts a saved predictor raises over a fleet file, one round a day: gpu, node, time_s, score.

    When the file is the one the predictor was trained on, alerts start where its training data ended:
    alerts inside the training span would be hindsight.
    """
    from gpufleet.health.fleet_arrays import build_arrays
    from gpufleet.health.predictor import Predictor, rolling_alerts

    predictor = Predictor.load(model)
    arrays = build_arrays(fleet, bin_h=predictor.bin_h)
    same = predictor.trained.get("fleet_start") == arrays.start.isoformat() and predictor.trained.get("source") == str(
        Path(fleet).resolve()
    )
    start_h = int(predictor.trained.get("end_hour", 0)) if same else 0
    alerts = rolling_alerts(predictor, arrays, start_h=start_h)
    return alerts.select(
        pl.col("gpu").cast(pl.UInt32),
        pl.col("node").cast(pl.UInt32),
        time_s=pl.col("hour").cast(pl.Float64) * 3600.0,
        score=pl.col("score").cast(pl.Float64),
    )


def predictor_horizon_h(model: str | Path) -> float:
    """The prediction horizon (hours) of a saved predictor: how long ahead its alerts look."""
    from gpufleet.health.predictor import Predictor

    return float(Predictor.load(model).features.horizon_h)
