"""Telemetry readers: DCGM exports in, one canonical wide frame out.

The canonical frame (what the fleet generator writes and every later stage reads) has one row per
(GPU, time), sorted by ``gpu`` then ``time``:

- ``gpu`` UInt32: dense fleet GPU code 0..n-1, in (host, local GPU index, UUID) order;
- ``node`` UInt32: dense code of the host, in host-name order;
- ``time`` Datetime("ms", "UTC");
- one column per field, named by its legacy DCGM name (``DCGM_FI_DEV_GPU_TEMP``), in catalog order:
  Float32 for gauges and counters, Int64 for bitmask fields and ``DCGM_FI_DEV_XID_ERRORS`` (0 = none);
  null where the source had no sample;
- then fields outside the catalog under their own names (Float32, sorted by name; listed in
  :attr:`TelemetryRead.unknown_fields`);
- then, when the source has them, the strings ``hostname``, ``uuid``, ``pci_bus_id`` and ``model``.

Readers are registered by name (``--reader prometheus``): ``prometheus`` (dcgm-exporter text exposition,
in :mod:`gpufleet.health.prometheus`), ``csv`` and ``parquet`` (wide or long tables, here). Hourly
resampling and XID merging live in :mod:`gpufleet.health.hourly`; their names, and the prometheus
module's, stay importable from here. See ``docs/health_telemetry.md``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health.fields import FIELDS, canonical_name
from gpufleet.health.fields import field as field_info
from gpufleet.health.xid import read_text
from gpufleet.registry import Registry

if TYPE_CHECKING:  # re-exported lazily by __getattr__ below (those modules import this one)
    from gpufleet.health.hourly import merge_xid_events as merge_xid_events
    from gpufleet.health.hourly import most_severe_expr as most_severe_expr
    from gpufleet.health.hourly import resample_hourly as resample_hourly
    from gpufleet.health.prometheus import PrometheusReader as PrometheusReader
    from gpufleet.health.prometheus import file_time as file_time
    from gpufleet.health.prometheus import parse_exposition as parse_exposition

#: Identity columns of the canonical frame, in order.
KEY_COLUMNS = ("gpu", "node", "time")
#: Optional string columns kept when the source has them, in order (they end the frame).
META_COLUMNS = ("hostname", "uuid", "pci_bus_id", "model")
#: The canonical XID column.
XID_COLUMN = "DCGM_FI_DEV_XID_ERRORS"
TIME_DTYPE = pl.Datetime("ms", "UTC")

_EXAMPLES = 5
_HOST, _DEV = "__host", "__dev"


@dataclass
class TelemetryRead:
    """A canonical telemetry frame and what reading it left behind."""

    frame: pl.DataFrame
    malformed: int = 0
    malformed_examples: list[str] = field(default_factory=list)
    unknown_fields: list[str] = field(default_factory=list)
    source: str = ""


class TelemetryReader(ABC):
    """Reads one telemetry file (or folder) into a :class:`TelemetryRead`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @abstractmethod
    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> TelemetryRead:
        """Read ``path``; ``columns`` maps canonical names (``time``, ``gpu``, a DCGM field) to source columns."""


READERS: Registry[TelemetryReader] = Registry("telemetry reader", HealthError, listing="available readers")
register_reader = READERS.register  # class decorator: ``@register_reader("name")``
reader_names = READERS.names  # the registered names, sorted
get_reader = READERS.create  # a new reader by name; HealthError listing the names for an unknown one


_PROM_SUFFIXES = (".prom", ".txt", ".metrics", ".prom.gz", ".txt.gz", ".metrics.gz")


def detect_reader(path: Path) -> str:
    """The reader for ``path``: folders and ``.prom``/``.txt`` are prometheus, ``.parquet`` parquet, ``.csv`` csv.

    Other names are sniffed: a first line starting with ``#`` or ``DCGM_`` means prometheus, else csv.
    """
    name = path.name.lower()
    if path.is_dir():
        return "prometheus"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".csv.gz", ".tsv")):
        return "csv"
    if name.endswith(_PROM_SUFFIXES):
        return "prometheus"
    head = read_text(path, "telemetry file").lstrip()[:200]
    return "prometheus" if head.startswith(("#", "DCGM_")) else "csv"


def read_telemetry(
    path: str | Path, reader: str | None = None, columns: Mapping[str, str] | None = None
) -> TelemetryRead:
    """Read a telemetry export into the canonical frame; ``reader=None`` picks one from the path.

    ``columns`` maps canonical names to source columns (``{"time": "timestamp", "gpu": "gpu_id"}``) for
    the csv and parquet readers; see :func:`parse_column_map` for the CLI form.
    """
    path = Path(path)
    if not path.exists():
        raise HealthError(f"{path}: no such file or folder; pass a dcgm-exporter dump, a CSV or a Parquet file")
    return get_reader(reader or detect_reader(path)).read(path, columns)


def parse_column_map(spec: str) -> dict[str, str]:
    """Parse the CLI form ``"time=timestamp,gpu=gpu_id,DCGM_FI_DEV_GPU_TEMP=temp_c"`` into a mapping."""
    result: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise HealthError(
                f"--columns: malformed pair '{part.strip()}' in '{spec}'; expected canonical=source pairs "
                "separated by commas, e.g. 'time=timestamp,gpu=gpu_id,host=node_name'"
            )
        result[key.strip()] = value.strip()
    return result


# ---------------------------------------------------------------------------------------------------
# assembling the canonical frame


def _order_fields(names: list[str]) -> tuple[list[str], list[str]]:
    """(known canonical fields in catalog order, unknown fields sorted)."""
    present = set(names)
    known = [f.name for f in FIELDS if f.name in present]
    return known, sorted(present - set(known))


def canonical_order(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with its columns in canonical order: keys, catalog fields, unknown fields, meta strings."""
    keys = [c for c in KEY_COLUMNS if c in frame.columns]
    known, unknown = _order_fields([c for c in frame.columns if c not in KEY_COLUMNS and c not in META_COLUMNS])
    return frame.select(*keys, *known, *unknown, *(c for c in META_COLUMNS if c in frame.columns))


def _assemble(
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
    fields = [c for c in wide.columns if c not in (_HOST, _DEV, "time", *META_COLUMNS)]
    known, unknown = _order_fields(fields)
    key = [_HOST, _DEV, *(["uuid"] if "uuid" in meta else [])]
    devices = (
        wide.select(key)
        .unique()
        .sort(key, nulls_last=True)
        .with_row_index("gpu")
        .with_columns(pl.col("gpu").cast(pl.UInt32))
    )
    hosts = devices.select(_HOST).unique().sort(_HOST, nulls_last=True).with_row_index("node")
    devices = devices.join(hosts.with_columns(pl.col("node").cast(pl.UInt32)), on=_HOST, nulls_equal=True)
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
    strings = [pl.col(_HOST).cast(pl.String).alias("hostname")] if host_is_name else []
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


def _parse_iso(value: str) -> datetime | None:
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)


def _epoch_unit(values: pl.Series) -> str:
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
        unit = _epoch_unit(values)
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
        fixed = [_parse_iso(v) if m else p for v, p, m in zip(text, parsed, missing, strict=True)]
        parsed = pl.Series(values.name, fixed, dtype=TIME_DTYPE)
        bad = parsed.is_null() & text.is_not_null()
        if bad.any():
            index = int(bad.arg_true()[0])
            raise HealthError(
                f"{where}: value '{text[index]}' (row {index + 1}) is not a time; use ISO 8601 "
                "(2024-05-06T12:00:00Z) or epoch seconds/milliseconds"
            )
    return parsed.cast(TIME_DTYPE)


def _field_name(metric: str) -> str:
    return canonical_name(metric) or metric


def _name_map(metrics: pl.Series) -> dict[str, str]:
    return {m: _field_name(m) for m in metrics.unique().to_list()}


def _long_to_wide(long: pl.DataFrame) -> pl.DataFrame:
    """Pivot (``__host``, ``__dev``, ``time``, ``field``, ``value`` + meta) to one column per field."""
    meta = [c for c in ("uuid", "pci_bus_id", "model") if c in long.columns and long[c].null_count() < long.height]
    index = [_HOST, _DEV, *(["uuid"] if "uuid" in meta else []), "time"]
    key = index[:-1]
    if long.schema[_HOST] == pl.String:
        long = long.with_columns(pl.col(_HOST).fill_null(""))
    if long.height == 0:
        return pl.DataFrame(schema={_HOST: pl.String, _DEV: pl.Int64, "time": TIME_DTYPE})
    wide = long.pivot(on="field", index=index, values="value", aggregate_function="last")
    others = [c for c in meta if c not in key]
    if others:
        per_device = long.group_by(key).agg(pl.col(c).drop_nulls().first() for c in others)
        wide = wide.join(per_device, on=key, how="left", nulls_equal=True)
    return wide


# ---------------------------------------------------------------------------------------------------
# tables (csv / parquet), wide or long

#: Source column names recognised without a mapping (case-insensitive, first match wins).
AUTO_COLUMNS: dict[str, tuple[str, ...]] = {
    "time": ("time", "timestamp", "ts", "datetime", "date_time"),
    "gpu": ("gpu", "gpu_id", "gpu_index", "gpu_idx", "device_id"),
    "host": ("hostname", "host", "node_name", "instance", "node"),
    "uuid": ("uuid", "gpu_uuid"),
    "pci_bus_id": ("pci_bus_id", "pci", "bus_id", "pci_id"),
    "model": ("model", "modelname", "gpu_model", "model_name"),
    "field": ("field", "metric", "metric_name", "__name__", "field_name"),
    "value": ("value", "val", "metric_value"),
}
_ROLES = tuple(AUTO_COLUMNS)


def _resolve_roles(names: list[str], columns: Mapping[str, str] | None, where: str) -> dict[str, str]:
    """Role (time, gpu, host, ...) → source column, from ``columns`` first and then by auto-detection."""
    lower = {n.lower(): n for n in reversed(names)}
    given = dict(columns or {})
    roles: dict[str, str] = {}
    for key, source in given.items():
        role = key.strip().lower()
        if role not in _ROLES:
            continue
        if source not in names:
            raise HealthError(
                f"{where}: --columns {key}={source}: the file has no column '{source}'; columns are: {', '.join(names)}"
            )
        roles[role] = source
    for role, candidates in AUTO_COLUMNS.items():
        if role not in roles:
            found = next((lower[c] for c in candidates if c in lower), None)
            if found is not None and found not in roles.values():
                roles[role] = found
    return roles


def _require(roles: dict[str, str], role: str, names: list[str], where: str, layout: str) -> str:
    if role not in roles:
        tried = ", ".join(AUTO_COLUMNS[role])
        raise HealthError(
            f"{where}: no '{role}' column for a {layout} telemetry table (looked for {tried}); columns are: "
            f"{', '.join(names)}; name it with --columns {role}=<source column>"
        )
    return roles[role]


def _device_columns(table: pl.DataFrame, roles: dict[str, str], where: str, layout: str) -> list[pl.Expr]:
    names = table.columns
    if "gpu" not in roles and "uuid" not in roles:
        _require(roles, "gpu", names, where, layout)
    host = pl.col(roles["host"]) if "host" in roles else pl.lit("")
    dev = pl.col(roles["gpu"]) if "gpu" in roles else pl.lit(None, dtype=pl.Int64)
    exprs = [host.alias(_HOST), dev.alias(_DEV)]
    exprs += [pl.col(roles[m]).cast(pl.String).alias(m) for m in ("uuid", "pci_bus_id", "model") if m in roles]
    return exprs


def _table_to_read(table: pl.DataFrame, path: Path, columns: Mapping[str, str] | None) -> TelemetryRead:
    where = str(path)
    names = table.columns
    roles = _resolve_roles(names, columns, where)
    renames = {source: target for target, source in (columns or {}).items() if target.strip().lower() not in _ROLES}
    for source in renames:
        if source not in names:
            raise HealthError(
                f"{where}: --columns {renames[source]}={source}: the file has no column '{source}'; columns are: "
                f"{', '.join(names)}"
            )
    host_is_name = "host" in roles and table.schema[roles["host"]] == pl.String
    long = "field" in roles and "value" in roles
    layout = "long" if long else "wide"
    time_col = _require(roles, "time", names, where, layout)
    time = to_utc_ms(table[time_col], f"{where} column '{time_col}'").alias("time")
    ids = _device_columns(table, roles, where, layout)
    if long:
        frame = table.select(
            *ids,
            time,
            pl.col(roles["field"]).cast(pl.String).alias("field"),
            pl.col(roles["value"]).cast(pl.Float64, strict=False).alias("value"),
        )
        frame = frame.with_columns(pl.col("field").replace(_name_map(frame["field"])))
        wide = _long_to_wide(frame.filter(pl.col("field").is_not_null()))
        return _assemble(wide, where, host_is_name=host_is_name)
    if "field" in roles or "value" in roles:
        missing = "value" if "field" in roles else "field"
        _require(roles, missing, names, where, "long")
    used = set(roles.values()) | {n for n in names if n in (*KEY_COLUMNS, *META_COLUMNS)}  # codes are recomputed
    fields: dict[str, list[str]] = {}
    for name in names:
        if name in used:
            continue
        target = renames.get(name) or name
        canonical = canonical_name(target)
        numeric = table.schema[name].is_numeric() or (
            table[name].cast(pl.Float64, strict=False).null_count() == table[name].null_count()
        )
        if canonical is None and not numeric:
            continue  # a non-numeric column outside the catalog (a driver version, a pod name): dropped
        fields.setdefault(canonical or target, []).append(name)
    exprs = [
        pl.coalesce([pl.col(s).cast(pl.Float64, strict=False) for s in sources]).alias(name)
        for name, sources in fields.items()
    ]
    wide = table.select(*ids, time, *exprs)
    return _assemble(wide, where, host_is_name=host_is_name)


@register_reader("csv")
class CsvReader(TelemetryReader):
    """A CSV (optionally gzipped), wide (one column per DCGM field, names or aliases) or long
    (``gpu,host,time,field,value``). Map other column names with ``--columns time=timestamp,gpu=gpu_id``."""

    description = "CSV, wide (one column per DCGM field) or long (gpu,host,time,field,value)"

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> TelemetryRead:
        try:
            table = pl.read_csv(
                path,
                infer_schema_length=10000,
                encoding="utf8-lossy",
                raise_if_empty=True,
                separator="\t" if path.name.lower().endswith(".tsv") else ",",
            )
        except pl.exceptions.NoDataError:
            raise HealthError(f"{path}: the file is empty; a telemetry CSV needs a header line and rows") from None
        except (pl.exceptions.PolarsError, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise HealthError(f"{path}: not a readable CSV file ({first}); check the format and encoding") from None
        return _table_to_read(table, path, columns)


@register_reader("parquet")
class ParquetReader(TelemetryReader):
    """A Parquet file, wide or long like the csv reader; canonical files written by gpufleet read back as is."""

    description = "Parquet, wide or long (canonical files written by gpufleet read back unchanged)"

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> TelemetryRead:
        try:
            table = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
            raise HealthError(f"{path}: not a readable Parquet file ({exc}); check the file") from None
        return _table_to_read(table, path, columns)


# ---------------------------------------------------------------------------------------------------
# names that moved to the prometheus and hourly modules, still importable from here

_MOVED = {
    "PrometheusReader": "gpufleet.health.prometheus",
    "file_time": "gpufleet.health.prometheus",
    "parse_exposition": "gpufleet.health.prometheus",
    "most_severe_expr": "gpufleet.health.hourly",
    "resample_hourly": "gpufleet.health.hourly",
    "merge_xid_events": "gpufleet.health.hourly",
}


def __getattr__(name: str) -> Any:
    """Lazy re-export of :data:`_MOVED` (a lazy one, because those modules import this one)."""
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The prometheus reader registers itself when its module is imported; it imports this module, so it is
# imported last, when every name it uses is defined.
from gpufleet.health import prometheus as _prometheus  # noqa: E402, F401
