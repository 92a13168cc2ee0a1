"""Turn a raw source table into canonical columns, keeping what validation needs to explain rejects.

Each parsed field ``x`` comes with ``__raw_x`` (the source value as text) so that validation can tell a
missing value from an unparsable one. ``__row`` is the 0-based data-row number in the source and
``__ts`` the absolute submit time when the source gave datetimes. All work is vectorised Polars.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from gpufleet.traces.columns import OPTIONAL_FIELDS
from gpufleet.traces.schema import CANONICAL_COLUMNS, DEFAULT_KIND

ROW = "__row"
TS = "__ts"
RAW_PREFIX = "__raw_"

#: Naive datetime layouts tried in order (``%.f`` also accepts no fraction).
_NAIVE_FORMATS = (
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%dT%H:%M",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d",
)
#: Layouts with a UTC offset or ``Z``; these are converted to UTC and made naive.
_AWARE_FORMATS = ("%Y-%m-%dT%H:%M:%S%.f%#z", "%Y-%m-%d %H:%M:%S%.f%#z")


@dataclass
class ParsedTable:
    """A source table mapped onto canonical columns, before validation."""

    frame: pl.DataFrame
    rows_read: int
    from_datetimes: bool  # submit times were absolute datetimes (``__ts`` holds them)
    origin: datetime | None = None  # stored origin of numeric submit times (Parquet metadata)


def raw_col(name: str) -> str:
    """Name of the column that keeps the source value of canonical column ``name``."""
    return RAW_PREFIX + name


def _text(series: pl.Series) -> pl.Series:
    """Source values as stripped strings, empty → null (numbers become their decimal text)."""
    out = series.cast(pl.String, strict=False).str.strip_chars().alias("v")
    return out.to_frame().select(pl.when(pl.col("v") != "").then(pl.col("v"))).to_series()


def _float(series: pl.Series) -> pl.Series:
    """Source values as Float64; anything unparsable becomes null."""
    if series.dtype.is_numeric():
        return series.cast(pl.Float64)
    if series.dtype == pl.Boolean:
        return pl.Series(series.name, [None] * series.len(), dtype=pl.Float64)
    return _text(series).cast(pl.Float64, strict=False)


def _parse_datetimes(text: pl.Series) -> pl.Series:
    """Vectorised datetime parsing over a few common layouts; unparsable values become null."""
    parsed: pl.Series | None = None
    for fmt in _NAIVE_FORMATS + _AWARE_FORMATS:
        attempt = text.str.to_datetime(fmt, strict=False, time_unit="us")
        if fmt in _AWARE_FORMATS:
            attempt = attempt.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
        parsed = attempt if parsed is None else parsed.fill_null(attempt)
        if parsed.null_count() == text.null_count():
            break
    assert parsed is not None
    return parsed


def _submit(series: pl.Series) -> tuple[pl.Series, pl.Series | None]:
    """Parse a submit column: numeric seconds, or datetimes (whichever parses more values).

    Returns (submit_s, absolute datetimes or None). For datetimes, submit_s is provisional: seconds
    since the earliest parsed time; the loader rebases it on the earliest *valid* job.
    """
    dtype = series.dtype
    if isinstance(dtype, pl.Datetime) and dtype.time_zone is not None:
        stamps = series.dt.convert_time_zone("UTC").dt.replace_time_zone(None).cast(pl.Datetime("us"))
    elif isinstance(dtype, pl.Datetime | pl.Date):
        stamps = series.cast(pl.Datetime("us"))
    elif dtype.is_numeric():
        return series.cast(pl.Float64), None
    else:
        text = _text(series)
        numbers = text.cast(pl.Float64, strict=False)
        if numbers.null_count() == text.null_count():
            return numbers, None
        stamps = _parse_datetimes(text)
        if stamps.null_count() >= numbers.null_count():
            return numbers, None
    since_first = (pl.col("t") - pl.col("t").min()).dt.total_microseconds().cast(pl.Float64) / 1e6
    seconds = stamps.alias("t").to_frame().select(since_first).to_series()
    return seconds, stamps


def _extra(series: pl.Series) -> pl.Series:
    """Type an unmapped string column: Int64 if every value is an integer, Float64 if numeric."""
    if series.dtype != pl.String:
        return series
    text = series.str.strip_chars()
    nonnull = text.len() - text.null_count()
    if nonnull == 0:
        return series
    for dtype in (pl.Int64, pl.Float64):
        cast = text.cast(dtype, strict=False)
        if cast.len() - cast.null_count() == nonnull:
            return cast
    return series


def parse_table(
    table: pl.DataFrame,
    mapping: Mapping[str, str],
    *,
    job_id_prefix: str,
    drop_blank: bool,
) -> ParsedTable:
    """Map ``table`` onto canonical columns using ``mapping`` (canonical → source column).

    ``drop_blank`` drops rows whose every field is null: blank CSV lines, which are not records.
    Unmapped job_id becomes ``<job_id_prefix>-<row>``; unmapped kind becomes "train". Mapped optional
    columns (``OPTIONAL_FIELDS``, e.g. ``model``) follow the canonical ones as text; unmapped source columns
    whose names clash with a canonical or optional column are kept as ``src_<name>``.
    """
    table = table.with_row_index(ROW).with_columns(pl.col(ROW).cast(pl.Int64))
    if drop_blank and table.width > 1:
        data_cols = [c for c in table.columns if c != ROW]
        table = table.filter(~pl.all_horizontal(pl.col(data_cols).is_null()))
    rows = table.height
    cols: dict[str, pl.Series] = {ROW: table[ROW]}
    from_datetimes = False

    if "job_id" in mapping:
        cols["job_id"] = _text(table[mapping["job_id"]])
    else:
        ids = pl.lit(f"{job_id_prefix}-") + pl.col(ROW).cast(pl.String)
        cols["job_id"] = table.select(ids.alias("job_id")).to_series()

    src = table[mapping["submit_s"]]
    submit, stamps = _submit(src)
    cols[raw_col("submit_s")] = _text(src)
    cols["submit_s"] = submit
    if stamps is not None:
        cols[TS] = stamps
        from_datetimes = True

    for name in ("duration_s", "num_gpus"):
        src = table[mapping[name]]
        cols[raw_col(name)] = _text(src)
        cols[name] = _float(src)

    for name in ("gpu_type", "user", "vc"):
        if name in mapping:
            cols[name] = _text(table[mapping[name]])
        else:
            cols[name] = pl.Series([None] * rows, dtype=pl.String)

    if "kind" in mapping:
        cols["kind"] = _text(table[mapping["kind"]]).str.to_lowercase().fill_null(DEFAULT_KIND)
    else:
        cols["kind"] = pl.Series([DEFAULT_KIND] * rows, dtype=pl.String)

    for name in OPTIONAL_FIELDS:
        if name in mapping:
            cols[name] = _text(table[mapping[name]])

    used = set(mapping.values()) | {ROW}
    reserved = set(CANONICAL_COLUMNS) | set(OPTIONAL_FIELDS)
    for column in table.columns:
        if column in used:
            continue
        name = column if column not in reserved else f"src_{column}"
        if name in cols:
            continue
        cols[name] = _extra(table[column])

    frame = pl.DataFrame({name: series.alias(name) for name, series in cols.items()})
    return ParsedTable(frame=frame, rows_read=rows, from_datetimes=from_datetimes)
