"""Hourly resampling of a canonical telemetry frame, and kernel-log XID events merged into it."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health.fields import canonical_name
from gpufleet.health.fields import field as field_info
from gpufleet.health.frame import KEY_COLUMNS, META_COLUMNS, TIME_DTYPE, XID_COLUMN, canonical_order
from gpufleet.health.xid import normalize_pci_expr, severity_rank_expr


def _field_columns(frame: pl.DataFrame) -> list[str]:
    return [c for c in frame.columns if c not in KEY_COLUMNS and c not in META_COLUMNS]


def _kind(name: str) -> str:
    name_ = canonical_name(name)
    return "gauge" if name_ is None else field_info(name_).kind


def most_severe_expr(col: str, rank: pl.Expr | None = None) -> pl.Expr:
    """Aggregation: the most severe XID of a group (earliest among equals); 0 if only zeros, null if all null.

    Rows must be in time order within the group.
    """
    code = pl.col(col)
    rank = severity_rank_expr(code) if rank is None else rank
    return (
        pl.when(rank.max() > 0)
        .then(code.get(rank.arg_max()))
        .when(code.is_not_null().any())
        .then(pl.lit(0, dtype=pl.Int64))
        .otherwise(pl.lit(None, dtype=pl.Int64))
        .cast(pl.Int64)
        .alias(col)
    )


def resample_hourly(frame: pl.DataFrame) -> pl.DataFrame:
    """Aggregate a canonical frame to one row per (gpu, hour), the hour's start as ``time``.

    Gauges (and unknown fields): mean. Counters: max (the last value of a monotone counter; a flag set at
    any time in the hour). Bitmasks: bitwise OR. ``DCGM_FI_DEV_XID_ERRORS``: the most severe code of the
    hour (:func:`gpufleet.health.xid.severity_rank`; the earliest among equally severe). Hours without a
    sample get no row.
    """
    missing = [c for c in KEY_COLUMNS if c not in frame.columns]
    if missing:
        raise HealthError(
            f"resample_hourly: the frame has no {', '.join(missing)} column; pass a canonical frame from read_telemetry"
        )
    aggs: list[pl.Expr] = [pl.col("node").first()]
    for name in _field_columns(frame):
        kind, col = _kind(name), pl.col(name)
        if kind == "counter":
            aggs.append(col.max())
        elif kind == "bitmask":
            aggs.append(col.cast(pl.Int64).bitwise_or())
        elif kind == "xid":
            aggs.append(most_severe_expr(name))
        else:
            aggs.append(col.mean().cast(frame.schema[name] if frame.schema[name].is_float() else pl.Float32))
    aggs += [pl.col(c).drop_nulls().first() for c in META_COLUMNS if c in frame.columns]
    return (
        frame.sort(["gpu", "time"])
        .group_by("gpu", pl.col("time").dt.truncate("1h"), maintain_order=True)
        .agg(aggs)
        .select(frame.columns)
        .sort(["gpu", "time"])
    )


def _devices_from_mapping(pci_to_gpu: Mapping[str, int]) -> pl.DataFrame:
    hosts, pcis, gpus = [], [], []
    for key, gpu in pci_to_gpu.items():
        host, sep, pci = key.rpartition("/")
        hosts.append(host if sep else None)
        pcis.append(pci)
        gpus.append(int(gpu))
    table = pl.DataFrame(
        {"__ehost": hosts, "__pci": pcis, "gpu": gpus},
        schema={"__ehost": pl.String, "__pci": pl.String, "gpu": pl.UInt32},
    )
    bad = table.filter(normalize_pci_expr(pl.col("__pci")).is_null())
    if bad.height:
        raise HealthError(
            f"pci_to_gpu: key '{bad['__pci'][0]}' is not a PCI bus id; use '0000:3b:00' or 'host/0000:3b:00'"
        )
    return table.with_columns(normalize_pci_expr(pl.col("__pci")))


def _match_events(events: pl.DataFrame, devices: pl.DataFrame) -> pl.DataFrame:
    """Events joined to ``gpu``: on host and PCI id where both sides know the host, else on a unique PCI id."""
    events = events.with_row_index("__event")
    exact = events.filter(pl.col("host").is_not_null()).join(
        devices.filter(pl.col("__ehost").is_not_null()), left_on=["host", "__pci"], right_on=["__ehost", "__pci"]
    )
    rest = events.join(exact.select("__event"), on="__event", how="anti")

    def unique_pci(candidates: pl.DataFrame) -> pl.DataFrame:
        return (
            candidates.group_by("__pci")
            .agg(pl.col("gpu").unique())
            .filter(pl.col("gpu").list.len() == 1)
            .with_columns(pl.col("gpu").list.first())
        )

    no_host = rest.filter(pl.col("host").is_null()).join(unique_pci(devices), on="__pci")
    hostless_devices = devices.filter(pl.col("__ehost").is_null())
    with_host = rest.filter(pl.col("host").is_not_null()).join(unique_pci(hostless_devices), on="__pci")
    cols = ["__event", "gpu", "time", "code"]
    return pl.concat([exact.select(cols), no_host.select(cols), with_host.select(cols)])


def merge_xid_events(
    frame: pl.DataFrame, events: pl.DataFrame, pci_to_gpu: Mapping[str, int] | None = None
) -> pl.DataFrame:
    """Fold kernel-log XID events into an hourly frame's ``DCGM_FI_DEV_XID_ERRORS`` (most severe per hour).

    ``events`` is :attr:`gpufleet.health.xid.XidLog.events` (``host``, ``pci``, ``code``, ``time``). Events
    are matched to GPUs on host and PCI id using the frame's ``hostname`` and ``pci_bus_id`` columns, or
    through ``pci_to_gpu`` (keys ``"0000:3b:00"`` or ``"host/0000:3b:00"``, any PCI spelling; values fleet
    GPU codes). An event hour with no telemetry row gets a row of nulls carrying the XID (a GPU that falls
    off the bus stops reporting). A frame without the XID column gets one (0 where no event). Events without
    a wall-clock time or a matching GPU are left out with a warning.
    """
    if "time" not in frame.columns or "gpu" not in frame.columns:
        raise HealthError("merge_xid_events: the frame has no gpu/time columns; pass a canonical frame")
    if frame.height and not (frame["time"].dt.truncate("1h") == frame["time"]).all():
        raise HealthError("merge_xid_events: the frame is not hourly; call resample_hourly(frame) first")
    for col in ("pci", "code", "time"):
        if col not in events.columns:
            raise HealthError(f"merge_xid_events: events have no '{col}' column; pass parse_kernel_log(...).events")
    if XID_COLUMN not in frame.columns:
        frame = canonical_order(frame.with_columns(pl.lit(0, dtype=pl.Int64).alias(XID_COLUMN)))
    if pci_to_gpu is not None:
        devices = _devices_from_mapping(pci_to_gpu)
    elif "pci_bus_id" in frame.columns:
        host = pl.col("hostname") if "hostname" in frame.columns else pl.lit(None, dtype=pl.String)
        devices = (
            frame.select(host.alias("__ehost"), normalize_pci_expr(pl.col("pci_bus_id")).alias("__pci"), "gpu")
            .unique()
            .drop_nulls("__pci")
        )
    else:
        raise HealthError(
            "merge_xid_events: the frame has no pci_bus_id column to match XID events on; pass "
            "pci_to_gpu={'0000:3b:00': gpu, ...} (or 'host/0000:3b:00' keys)"
        )
    devices = devices.join(frame.select("gpu").unique(), on="gpu", how="semi")
    timed = events.filter(pl.col("time").is_not_null())
    host = pl.col("host") if "host" in events.columns else pl.lit(None, dtype=pl.String)
    timed = timed.select(
        host.cast(pl.String).alias("host"),
        normalize_pci_expr(pl.col("pci")).alias("__pci"),
        pl.col("code").cast(pl.Int64),
        pl.col("time").cast(TIME_DTYPE),
    )
    matched = _match_events(timed, devices)
    left_out = events.height - matched.height
    if left_out:
        warnings.warn(
            f"merge_xid_events: {left_out} of {events.height} XID events left out (no wall-clock time, or no GPU "
            "with that host and PCI id); pass pci_to_gpu or fill times with xid.with_boot_time",
            stacklevel=2,
        )
    hourly = (
        matched.sort(["gpu", "time"])
        .group_by("gpu", pl.col("time").dt.truncate("1h"), maintain_order=True)
        .agg(most_severe_expr("code"))
        .rename({"code": "__event_xid"})
    )
    schema = frame.schema
    fill = [c for c in ("node", *META_COLUMNS) if c in frame.columns]
    new_hours = hourly.join(frame.select("gpu", "time"), on=["gpu", "time"], how="anti")
    if new_hours.height:
        per_gpu = frame.group_by("gpu").agg(pl.col(c).drop_nulls().first() for c in fill)
        extra = new_hours.select("gpu", "time").join(per_gpu, on="gpu", how="left")
        extra = extra.select(
            [
                pl.col(c).cast(schema[c]) if c in extra.columns else pl.lit(None, dtype=schema[c]).alias(c)
                for c in frame.columns
            ]
        )
        frame = pl.concat([frame, extra])
    merged = frame.join(hourly, on=["gpu", "time"], how="left")
    current, incoming = pl.col(XID_COLUMN), pl.col("__event_xid")
    take_event = incoming.is_not_null() & (severity_rank_expr(incoming) >= severity_rank_expr(current))
    return (
        merged.with_columns(pl.when(take_event).then(incoming).otherwise(current).cast(pl.Int64).alias(XID_COLUMN))
        .drop("__event_xid")
        .sort(["gpu", "time"])
    )
