"""The canonical telemetry frame and the helpers every telemetry reader builds it with.

Public on purpose: the readers in :mod:`gpufleet.health.readers` (tables, prometheus, any new one) import
these names from here, so no reader reaches into another's private names. The frame's layout is described
in :mod:`gpufleet.health.readers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health.fields import FIELDS, canonical_name
from gpufleet.health.fields import field as field_info

#: Identity columns of the canonical frame, in order.
KEY_COLUMNS = ("gpu", "node", "time")
#: Optional string columns kept when the source has them, in order (they end the frame).
META_COLUMNS = ("hostname", "uuid", "pci_bus_id", "model")
#: The canonical XID column.
XID_COLUMN = "DCGM_FI_DEV_XID_ERRORS"
TIME_DTYPE = pl.Datetime("ms", "UTC")

EXAMPLES = 5
#: Internal device-key columns of a wide frame before :func:`assemble` (host, local device index).
HOST, DEV = "__host", "__dev"


@dataclass
class TelemetryRead:
    """A canonical telemetry frame and what reading it left behind."""

    frame: pl.DataFrame
    malformed: int = 0
    malformed_examples: list[str] = field(default_factory=list)
    unknown_fields: list[str] = field(default_factory=list)
    source: str = ""


def order_fields(names: list[str]) -> tuple[list[str], list[str]]:
    """(known canonical fields in catalog order, unknown fields sorted)."""
    present = set(names)
    known = [f.name for f in FIELDS if f.name in present]
    return known, sorted(present - set(known))


def canonical_order(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with its columns in canonical order: keys, catalog fields, unknown fields, meta strings."""
    keys = [c for c in KEY_COLUMNS if c in frame.columns]
    known, unknown = order_fields([c for c in frame.columns if c not in KEY_COLUMNS and c not in META_COLUMNS])
    return frame.select(*keys, *known, *unknown, *(c for c in META_COLUMNS if c in frame.columns))


def assemble(
    wide: pl.DataFrame,
    source: str,
    *,
    malformed: int = 0,
    examples: list[str] | None = None,
    host_is_name: bool = True,
) -> TelemetryRead:
    """Canonical frame from an internal wide frame: ``__host``, ``__dev``, ``time``, meta strings, fields.

    ``__host`` and ``__dev`` identify a device (any sortable dtype); ``uuid`` joins the device key when
    present. ``host_is_name`` says whether ``__host`` is a host name (kept as ``hostname``).
    """
    meta = [c for c in META_COLUMNS if c in wide.columns and c != "hostname"]
    fields = [c for c in wide.columns if c not in (HOST, DEV, "time", *META_COLUMNS)]
    known, unknown = order_fields(fields)
    key = [HOST, DEV, *(["uuid"] if "uuid" in meta else [])]
    devices = (
        wide.select(key)
        .unique()
        .sort(key, nulls_last=True)
        .with_row_index("gpu")
        .with_columns(pl.col("gpu").cast(pl.UInt32))
    )
    hosts = devices.select(HOST).unique().sort(HOST, nulls_last=True).with_row_index("node")
    devices = devices.join(hosts.with_columns(pl.col("node").cast(pl.UInt32)), on=HOST, nulls_equal=True)
    frame = wide.join(devices, on=key, how="left", nulls_equal=True)
    casts = []
    for name in known:
        info = field_info(name)
        col = pl.col(name)
        if info.is_integer:
            casts.append(col.cast(pl.Float64, strict=False).round(0).cast(pl.Int64, strict=False))
        else:
            casts.append(col.cast(pl.Float32, strict=False))
    casts += [pl.col(name).cast(pl.Float32, strict=False) for name in unknown]
    strings = [pl.col(HOST).cast(pl.String).alias("hostname")] if host_is_name else []
    strings += [pl.col(c).cast(pl.String) for c in meta]
    frame = (
        frame.select(*KEY_COLUMNS, *casts, *strings)
        .unique(subset=["gpu", "time"], keep="last", maintain_order=True)
        .sort(["gpu", "time"])
    )
    return TelemetryRead(
        frame=frame,
        malformed=malformed,
        malformed_examples=list(examples or []),
        unknown_fields=unknown,
        source=source,
    )


def parse_iso(value: str) -> datetime | None:
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)


def epoch_unit(values: pl.Series) -> str:
    """Seconds, ms, us or ns, guessed from the magnitude of epoch numbers (years 1973 to 5138)."""
    top = values.abs().max()
    top = 0.0 if top is None else float(top)  # type: ignore[arg-type]
    if top < 1e11:
        return "s"
    if top < 1e14:
        return "ms"
    return "us" if top < 1e17 else "ns"


def to_utc_ms(values: pl.Series, where: str) -> pl.Series:
    """A time column as Datetime("ms", "UTC"): datetimes (naive = UTC), ISO strings or epoch numbers.

    Epoch numbers are seconds, milliseconds, microseconds or nanoseconds, told apart by magnitude.
    Raises HealthError naming ``where`` and the first value that is not a time.
    """
    dtype = values.dtype
    if isinstance(dtype, pl.Datetime):
        out = values.dt.replace_time_zone("UTC") if dtype.time_zone is None else values.dt.convert_time_zone("UTC")
        return out.cast(TIME_DTYPE)
    if dtype == pl.Date:
        return values.cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")
    if dtype.is_numeric():
        unit = epoch_unit(values)
        scale = {"s": 1000.0, "ms": 1.0, "us": 1e-3, "ns": 1e-6}[unit]
        millis = (values.cast(pl.Float64) * scale).round(0).cast(pl.Int64)
        return millis.cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")
    text = values.cast(pl.String)
    numeric = text.cast(pl.Float64, strict=False)
    if numeric.null_count() == text.null_count():
        return to_utc_ms(numeric, where)
    parsed = text.str.to_datetime(time_unit="ms", time_zone="UTC", strict=False)
    missing = parsed.is_null() & text.is_not_null()
    if missing.any():  # mixed formats: parse the rest one by one
        fixed = [parse_iso(v) if m else p for v, p, m in zip(text, parsed, missing, strict=True)]
        parsed = pl.Series(values.name, fixed, dtype=TIME_DTYPE)
        bad = parsed.is_null() & text.is_not_null()
        if bad.any():
            index = int(bad.arg_true()[0])
            raise HealthError(
                f"{where}: value '{text[index]}' (row {index + 1}) is not a time; use ISO 8601 "
                "(2024-05-06T12:00:00Z) or epoch seconds/milliseconds"
            )
    return parsed.cast(TIME_DTYPE)


def field_name(metric: str) -> str:
    return canonical_name(metric) or metric


def name_map(metrics: pl.Series) -> dict[str, str]:
    return {m: field_name(m) for m in metrics.unique().to_list()}


def long_to_wide(long: pl.DataFrame) -> pl.DataFrame:
    """Pivot (``__host``, ``__dev``, ``time``, ``field``, ``value`` + meta) to one column per field."""
    meta = [c for c in ("uuid", "pci_bus_id", "model") if c in long.columns and long[c].null_count() < long.height]
    index = [HOST, DEV, *(["uuid"] if "uuid" in meta else []), "time"]
    key = index[:-1]
    if long.schema[HOST] == pl.String:
        long = long.with_columns(pl.col(HOST).fill_null(""))
    if long.height == 0:
        return pl.DataFrame(schema={HOST: pl.String, DEV: pl.Int64, "time": TIME_DTYPE})
    wide = long.pivot(on="field", index=index, values="value", aggregate_function="last")
    others = [c for c in meta if c not in key]
    if others:
        per_device = long.group_by(key).agg(pl.col(c).drop_nulls().first() for c in others)
        wide = wide.join(per_device, on=key, how="left", nulls_equal=True)
    return wide
