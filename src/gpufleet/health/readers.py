"""Telemetry readers: DCGM exports in, one canonical wide frame out; plus hourly resampling and XID merging.

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

Readers are registered by name (``--reader prometheus``): ``prometheus`` (dcgm-exporter text exposition),
``csv`` and ``parquet`` (wide or long tables). See ``docs/health_telemetry.md``.
"""

from __future__ import annotations

import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, TypeVar

import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health.fields import FIELDS, canonical_name
from gpufleet.health.fields import field as field_info
from gpufleet.health.xid import normalize_pci_expr, read_text, severity_rank_expr

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


READERS: dict[str, type[TelemetryReader]] = {}
R = TypeVar("R", bound=type[TelemetryReader])


def register_reader(name: str) -> Callable[[R], R]:
    """Class decorator: make a telemetry reader available under ``name``."""

    def decorate(cls: R) -> R:
        cls.name = name
        READERS[name] = cls
        return cls

    return decorate


def reader_names() -> list[str]:
    """Names of the registered telemetry readers, sorted."""
    return sorted(READERS)


def get_reader(name: str) -> TelemetryReader:
    """An instance of the reader registered as ``name``; HealthError listing the names otherwise."""
    try:
        return READERS[name]()
    except KeyError:
        raise HealthError(
            f"unknown telemetry reader '{name}'; available readers: {', '.join(reader_names())}"
        ) from None


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


# ---------------------------------------------------------------------------------------------------
# prometheus text exposition (dcgm-exporter)

#: A metric name; a sample line is ``name{labels} value [timestamp_ms]``.
_METRIC = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
_LABELS_OK = r'^\s*(?:[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"\s*(?:,\s*|$))*$'
_SCRAPE = r"^#\s*scrape:?\s+(\S+)\s*$"
_NAME_TIME = re.compile(
    r"(?P<y>\d{4})-?(?P<mo>\d{2})-?(?P<d>\d{2})[T_ -]?(?P<h>\d{2})[:-]?(?P<mi>\d{2})[:-]?(?P<s>\d{2})"
)
_NAME_EPOCH = re.compile(r"(?<!\d)(\d{10}|\d{13})(?!\d)")
#: dcgm-exporter labels → canonical meta columns.
_LABELS = {
    "gpu": "gpu",
    "UUID": "uuid",
    "pci_bus_id": "pci_bus_id",
    "modelName": "model",
    "Hostname": "hostname",
    "instance": "instance",
}


def _label(labels: pl.Expr, name: str) -> pl.Expr:
    return labels.str.extract(rf'(?:^|,)\s*{name}\s*=\s*"((?:[^"\\]|\\.)*)"', 1)


def file_time(path: Path) -> datetime:
    """The time a single scrape file stands for: a timestamp in its name, else its modification time.

    Names such as ``dcgm-20240506T120000Z.prom``, ``2024-05-06T12:00:00.prom`` (UTC) or ``scrape-1714996800.prom``
    (epoch seconds or milliseconds) are understood.
    """
    m = _NAME_TIME.search(path.name)
    if m is not None:
        try:
            return datetime(*(int(m[k]) for k in ("y", "mo", "d", "h", "mi", "s")), tzinfo=UTC)
        except ValueError:
            pass
    e = _NAME_EPOCH.search(path.name)
    if e is not None:
        value = int(e[1])
        return datetime.fromtimestamp(value / 1000 if len(e[1]) == 13 else value, tz=UTC)
    return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)


def _scrape_times(frame: pl.DataFrame, name: str) -> pl.Series:
    """Per line of ``frame["text"]``, the time of the ``# scrape <ISO time>`` marker above it (null before one)."""
    marker = frame["text"].str.strip_chars().str.extract(_SCRAPE, 1)
    stamps: dict[str, datetime] = {}
    for line, value in frame.select("line", marker.alias("m")).drop_nulls("m").iter_rows():
        if value not in stamps:
            stamp = _parse_iso(value)
            if stamp is None:
                raise HealthError(
                    f"{name} line {line}: scrape marker time '{value}' is not ISO 8601; "
                    "write it as '# scrape 2024-05-06T12:00:00Z'"
                )
            stamps[value] = stamp
    if not stamps:
        return pl.Series("scrape", [None] * frame.height, dtype=TIME_DTYPE)
    times = marker.replace_strict(stamps, default=None, return_dtype=TIME_DTYPE)
    return times.forward_fill().alias("scrape")


def _split_samples(samples: pl.DataFrame) -> pl.DataFrame:
    """``body`` (a sample line) split into metric, labels, value and stamp, with an ``ok`` flag."""
    body = pl.col("body")
    opening = body.str.find("{", literal=True)
    closing = body.str.find(r"\}[^}]*$")
    blank = body.str.find(" ", literal=True)
    name_end = pl.coalesce(opening, blank)
    tail = body.str.slice(pl.coalesce(closing + 1, blank)).str.strip_chars().str.replace_all(r"\s+", " ")
    parts = samples.with_columns(
        body.str.slice(0, name_end).str.strip_chars().alias("metric"),
        pl.when(opening.is_not_null()).then(body.str.slice(opening + 1, closing - opening - 1)).alias("labels"),
        tail.str.split(" ").alias("tail"),
    )
    value = pl.col("tail").list.get(0, null_on_oob=True).cast(pl.Float64, strict=False)
    stamp = pl.col("tail").list.get(1, null_on_oob=True)
    ok = (
        pl.col("metric").str.contains(_METRIC)
        & (opening.is_null() | (closing > opening))
        & value.is_not_null()
        & (pl.col("tail").list.len() <= 2)
        & (stamp.is_null() | stamp.str.contains(r"^-?\d+$"))
    )
    parts = parts.with_columns(value.alias("value"), stamp.cast(pl.Int64, strict=False).alias("stamp"), ok.alias("ok"))
    # label syntax is checked once per distinct label set (scrapes repeat them)
    distinct = parts.select(pl.col("labels").unique()).filter(pl.col("labels").is_not_null())
    good = distinct.filter(pl.col("labels").str.contains(_LABELS_OK))
    return parts.with_columns(
        pl.col("ok") & (pl.col("labels").is_null() | pl.col("labels").is_in(good["labels"].implode()))
    )


def parse_exposition(text: str, default_time: datetime, name: str) -> tuple[pl.DataFrame, int, list[str]]:
    """Samples of one exposition text as a long frame, with the malformed-line count and examples.

    A sample's time is its own millisecond timestamp, else the ``# scrape`` marker above it, else
    ``default_time``. Samples without a ``gpu`` or ``UUID`` label (not per-GPU) are skipped.
    """
    frame = pl.DataFrame({"text": text.splitlines()}, schema={"text": pl.String}).with_row_index("line", offset=1)
    frame = frame.with_columns(_scrape_times(frame, name))
    body = pl.col("text").str.strip_chars()
    frame = _split_samples(frame.filter((body != "") & ~body.str.starts_with("#")).with_columns(body.alias("body")))
    bad = frame.filter(~pl.col("ok"))
    examples = [
        f"{name} line {n}: {t.strip()[:200]}" for n, t in bad.head(_EXAMPLES).select("line", "text").iter_rows()
    ]
    samples = frame.filter(pl.col("ok")).with_columns(pl.col("labels").fill_null(""))
    # labels are parsed once per distinct label set, metric names mapped once per distinct name
    label_sets = samples.select(pl.col("labels").unique())
    label_sets = label_sets.with_columns(*(_label(pl.col("labels"), lab).alias(col) for lab, col in _LABELS.items()))
    samples = samples.join(label_sets, on="labels", how="left").filter(
        pl.col("gpu").is_not_null() | pl.col("uuid").is_not_null()
    )
    stamp = pl.col("stamp").cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")
    default = pl.lit(default_time).cast(TIME_DTYPE)
    long = samples.select(
        pl.coalesce(pl.col("hostname"), pl.col("instance").str.replace(r":\d+$", ""), pl.lit("")).alias(_HOST),
        pl.col("gpu").cast(pl.Int64, strict=False).alias(_DEV),
        pl.col("uuid"),
        pl.col("pci_bus_id"),
        pl.col("model"),
        pl.coalesce(stamp, pl.col("scrape"), default).alias("time"),
        pl.col("metric").replace(_name_map(samples["metric"])).alias("field"),
        pl.col("value"),
    )
    return long, bad.height, examples


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


@register_reader("prometheus")
class PrometheusReader(TelemetryReader):
    """dcgm-exporter ``/metrics`` text: one file of scrapes, or a folder of ``*.prom``/``*.txt`` scrapes.

    Time of a sample: its trailing millisecond timestamp; else the latest ``# scrape <ISO time>`` comment
    above it; else the file's time (:func:`file_time`: a timestamp in the file name, else the mtime).
    Files of a folder are read in name order; ``.gz`` files are decompressed.
    """

    description = "dcgm-exporter /metrics text (file of scrapes, or a folder of *.prom / *.txt scrapes)"

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> TelemetryRead:
        if columns:
            raise HealthError(
                f"{path}: --columns does not apply to the prometheus reader (names come from the metrics); drop it"
            )
        files = [path]
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(_PROM_SUFFIXES))
            if not files:
                raise HealthError(f"{path}: no *.prom or *.txt scrape files in this folder; point at the scrape files")
        parts: list[pl.DataFrame] = []
        malformed = 0
        examples: list[str] = []
        for file in files:
            long, bad, ex = parse_exposition(read_text(file, "dcgm-exporter metrics dump"), file_time(file), str(file))
            parts.append(long)
            malformed += bad
            examples += ex
        long = pl.concat(parts, how="vertical_relaxed")
        if long.height == 0:
            raise HealthError(
                f"{path}: no per-GPU samples found ({malformed} malformed lines); expected dcgm-exporter lines "
                'such as DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-...",Hostname="node-1"} 34'
            )
        host_is_name = bool((long[_HOST] != "").any())
        wide = _long_to_wide(long)
        return _assemble(wide, str(path), malformed=malformed, examples=examples[:_EXAMPLES], host_is_name=host_is_name)


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
# hourly resampling and kernel-log XIDs


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
