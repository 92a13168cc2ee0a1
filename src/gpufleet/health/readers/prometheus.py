"""The ``prometheus`` telemetry reader: dcgm-exporter ``/metrics`` text exposition into the canonical frame.

Registered by name when the telemetry-reader registry first looks a name up (it imports every module here).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health.frame import (
    DEV,
    EXAMPLES,
    HOST,
    TIME_DTYPE,
    TelemetryRead,
    assemble,
    long_to_wide,
    name_map,
    parse_iso,
)
from gpufleet.health.readers import TelemetryReader, register_reader
from gpufleet.health.xid import read_text

#: File-name endings of scrape files (a folder is read file by file, these only).
PROM_SUFFIXES = (".prom", ".txt", ".metrics", ".prom.gz", ".txt.gz", ".metrics.gz")
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
            stamp = parse_iso(value)
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
    examples = [f"{name} line {n}: {t.strip()[:200]}" for n, t in bad.head(EXAMPLES).select("line", "text").iter_rows()]
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
        pl.coalesce(pl.col("hostname"), pl.col("instance").str.replace(r":\d+$", ""), pl.lit("")).alias(HOST),
        pl.col("gpu").cast(pl.Int64, strict=False).alias(DEV),
        pl.col("uuid"),
        pl.col("pci_bus_id"),
        pl.col("model"),
        pl.coalesce(stamp, pl.col("scrape"), default).alias("time"),
        pl.col("metric").replace(name_map(samples["metric"])).alias("field"),
        pl.col("value"),
    )
    return long, bad.height, examples


@register_reader("prometheus")
class PrometheusReader(TelemetryReader):
    """dcgm-exporter ``/metrics`` text: one file of scrapes, or a folder of ``*.prom``/``*.txt`` scrapes.

    Time of a sample: its trailing millisecond timestamp; else the latest ``# scrape <ISO time>`` comment
    above it; else the file's time (:func:`file_time`: a timestamp in the file name, else the mtime).
    Files of a folder are read in name order; ``.gz`` files are decompressed.
    """

    description = "dcgm-exporter /metrics text (file of scrapes, or a folder of *.prom / *.txt scrapes)"

    @classmethod
    def sniff(cls, path: Path) -> bool | None:
        """A folder, a scrape-file suffix, or a first line starting with ``#`` or ``DCGM_``."""
        if path.is_dir() or path.name.lower().endswith(PROM_SUFFIXES):
            return True
        return read_text(path, "telemetry file").lstrip()[:200].startswith(("#", "DCGM_"))

    @classmethod
    def write_sample(cls, folder: Path) -> Path:
        path = folder / "tiny-dcgm.prom"
        lines = [
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",UUID="GPU-{g}",Hostname="node-1"}} {40 + g} {1714996800000 + 60000 * k}'
            for k in range(3)
            for g in range(2)
        ]
        path.write_text("# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (C).\n" + "\n".join(lines) + "\n")
        return path

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> TelemetryRead:
        if columns:
            raise HealthError(
                f"{path}: --columns does not apply to the prometheus reader (names come from the metrics); drop it"
            )
        files = [path]
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(PROM_SUFFIXES))
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
        host_is_name = bool((long[HOST] != "").any())
        wide = long_to_wide(long)
        return assemble(wide, str(path), malformed=malformed, examples=examples[:EXAMPLES], host_is_name=host_is_name)
