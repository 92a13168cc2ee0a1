"""Read per-step timings of every rank (CSV or Parquet, long or wide) into one canonical long frame.

The frame is ``rank, step, section, duration_s``, what :func:`gpufleet.diagnose.stragglers.detect_stragglers`
scores. Columns are found by their usual names (any case) or named with ``--columns`` (:func:`parse_columns`).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from gpufleet.colmap import parse_column_map
from gpufleet.errors import DiagnoseError

__all__ = ["CANONICAL", "DEFAULT_SECTION", "DURATION_ALIASES", "MAPPING_KEYS", "parse_columns", "read_timings"]

CANONICAL = ("rank", "step", "section", "duration_s")
DEFAULT_SECTION = "step"

#: Column names recognised without ``--columns`` (compared lower-case), in order of preference.
RANK_ALIASES = ("rank", "global_rank", "rank_id", "worker", "worker_id", "process_rank")
STEP_ALIASES = ("step", "global_step", "iteration", "iter", "it", "step_id", "batch_idx", "time")
SECTION_ALIASES = ("section", "phase", "stage", "region")
#: Duration aliases and the factor that turns them into seconds. ``batch_time_norm`` (Alibaba PAI, 0-1000) has
#: no unit; every score is a ratio, so any consistent unit works.
DURATION_ALIASES: dict[str, float] = {
    "duration_s": 1.0,
    "duration": 1.0,
    "seconds": 1.0,
    "step_time_s": 1.0,
    "step_time": 1.0,
    "iter_time": 1.0,
    "iteration_time": 1.0,
    "batch_time": 1.0,
    "batch_time_norm": 1.0,
    "elapsed_s": 1.0,
    "elapsed": 1.0,
    "time_s": 1.0,
    "duration_ms": 1e-3,
    "step_time_ms": 1e-3,
    "iter_time_ms": 1e-3,
    "batch_time_ms": 1e-3,
    "time_ms": 1e-3,
    "elapsed_ms": 1e-3,
    "duration_us": 1e-6,
    "duration_ns": 1e-9,
}
#: Keys accepted by ``--columns`` / ``read_timings(columns=...)``; ``sections`` lists wide-format columns (a+b+c).
MAPPING_KEYS = (
    "rank",
    "step",
    "section",
    "duration",
    "duration_s",
    "duration_ms",
    "duration_us",
    "duration_ns",
    "sections",
)
_UNIT_SUFFIX = {"_s": 1.0, "_ms": 1e-3, "_us": 1e-6, "_ns": 1e-9}
#: Numeric columns never taken for a wide-format section.
_NOT_SECTIONS = {
    "",
    "index",
    "idx",
    "unnamed: 0",
    "gpu",
    "gpus",
    "node",
    "host",
    "hostname",
    "timestamp",
    "ts",
    "wall_time",
    "walltime",
    "epoch",
    "local_rank",
    "world_size",
    "job",
    "job_id",
    "pid",
}
_FIX = "name them with --columns rank=COL,step=COL,duration=COL (or duration_ms=COL)"


def parse_columns(spec: str | None) -> dict[str, str] | None:
    """Parse ``"rank=worker,step=time,duration=batch_time_norm"`` (the CLI's ``--columns``) into a mapping.

    None or a blank text gives None (find the columns by name); errors raise DiagnoseError
    (:func:`gpufleet.colmap.parse_column_map`).
    """
    if spec is None or not spec.strip():
        return None
    return parse_column_map(
        spec, keys=MAPPING_KEYS, error=DiagnoseError, example="rank=worker,step=time,duration=batch_time_norm"
    )


def read_timings(path: str | Path, columns: dict[str, str] | None = None) -> pl.DataFrame:
    """Read per-step timings (CSV or Parquet) into the canonical long frame ``rank, step, section, duration_s``.

    Long format: one row per (rank, step[, section]) with a duration. Recognised names (any case):
    rank <- rank, global_rank, rank_id, worker, worker_id, process_rank;
    step <- step, global_step, iteration, iter, it, step_id, batch_idx, time;
    section <- section, phase, stage, region (default ``"step"``);
    duration <- duration_s, duration, seconds, step_time[_s], iter_time, iteration_time, batch_time,
    batch_time_norm, elapsed[_s], time_s, and ``*_ms``/``_us``/``_ns`` variants (converted to seconds).
    Wide format (an online monitor): rank, step and one numeric column per section (``data, forward, backward,
    optimizer, comm``; a ``_ms`` suffix is converted) - used when no duration or section column is found.
    ``columns`` overrides the names, e.g. ``{"rank": "worker", "step": "time", "duration": "batch_time_norm"}``
    or ``{"sections": "fwd+bwd"}``; see :func:`parse_columns`.
    """
    path = Path(path)
    raw = _read_table(path)
    mapping = {k.lower(): v for k, v in (columns or {}).items()}
    unknown = sorted(set(mapping) - set(MAPPING_KEYS))
    if unknown:
        raise DiagnoseError(f"{path}: unknown --columns key(s) {unknown}; use one of {', '.join(MAPPING_KEYS)}")
    found = raw.columns
    for key, col in mapping.items():
        names = col.replace(";", "+").split("+") if key == "sections" else [col]
        for name in names:
            if name not in found:
                raise DiagnoseError(f"{path}: --columns {key}={name}: no column {name!r}; columns found: {found}")
    rank_col = mapping.get("rank") or _find(found, RANK_ALIASES)
    step_col = mapping.get("step") or _find(found, STEP_ALIASES)
    missing = [name for name, col in (("rank", rank_col), ("step", step_col)) if col is None]
    if missing:
        raise DiagnoseError(f"{path}: no {' or '.join(missing)} column; columns found: {found}; {_FIX}")
    dur_col, scale = _duration_column(found, mapping)
    sec_col = mapping.get("section") or _find(found, SECTION_ALIASES)
    if dur_col is not None:
        long = raw.select(
            _int_column(raw, path, rank_col, "rank"),
            _int_column(raw, path, step_col, "step"),
            (pl.col(sec_col).cast(pl.Utf8) if sec_col else pl.lit(DEFAULT_SECTION)).alias("section"),
            _float_column(raw, path, dur_col, scale),
        )
    elif sec_col is not None:
        raise DiagnoseError(
            f"{path}: a section column ({sec_col!r}) but no duration column; columns found: {found}; {_FIX}"
        )
    else:
        long = _melt_wide(raw, path, rank_col, step_col, mapping.get("sections"))
    return _finish(long, path)


def _read_table(path: Path) -> pl.DataFrame:
    """Read a CSV or Parquet file, turning I/O and parse failures into DiagnoseError."""
    if not path.is_file():
        raise DiagnoseError(f"{path}: no such file; give a CSV or Parquet file of per-step timings")
    parquet = path.suffix.lower() in (".parquet", ".pq")
    try:
        return pl.read_parquet(path) if parquet else pl.read_csv(path, infer_schema_length=10_000)
    except Exception as exc:  # polars raises many types for a bad file
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise DiagnoseError(
            f"{path}: cannot be read as {'Parquet' if parquet else 'CSV'} ({type(exc).__name__}:"
            f" {first}); give a CSV (.csv) or Parquet (.parquet) file"
        ) from exc


def _find(found: list[str], aliases: tuple[str, ...]) -> str | None:
    """The first column whose lower-cased name is in ``aliases``, honouring the aliases' order."""
    lower = {c.lower().strip(): c for c in found}
    return next((lower[a] for a in aliases if a in lower), None)


def _duration_column(found: list[str], mapping: dict[str, str]) -> tuple[str | None, float]:
    """The duration column and its factor to seconds, from the mapping or the aliases."""
    for key, factor in (
        ("duration", 1.0),
        ("duration_s", 1.0),
        ("duration_ms", 1e-3),
        ("duration_us", 1e-6),
        ("duration_ns", 1e-9),
    ):
        if key in mapping:
            return mapping[key], factor
    if "sections" in mapping:
        return None, 1.0
    lower = {c.lower().strip(): c for c in found}
    for alias, factor in DURATION_ALIASES.items():
        if alias in lower:
            return lower[alias], factor
    return None, 1.0


def _int_column(raw: pl.DataFrame, path: Path, col: str, role: str) -> pl.Expr:
    """``col`` as Int64 named ``role``; non-integer values raise DiagnoseError naming file and column."""
    s = raw.get_column(col)
    if s.dtype.is_integer():
        return pl.col(col).cast(pl.Int64).alias(role)
    cast = s.cast(pl.Float64, strict=False)
    bad = cast.is_null() & s.is_not_null()
    frac = cast.fill_null(0.0) % 1 != 0
    if bad.any() or frac.any():
        example = s.filter(bad | frac).head(1).to_list()
        raise DiagnoseError(
            f"{path}: column {col!r} ({role}) holds non-integer values such as {example};"
            f" map an integer {role} column with --columns {role}=COL"
        )
    return pl.col(col).cast(pl.Float64, strict=False).cast(pl.Int64).alias(role)


def _float_column(raw: pl.DataFrame, path: Path, col: str, scale: float) -> pl.Expr:
    """``col`` as seconds (Float64) named ``duration_s``; text that is not a number raises DiagnoseError."""
    s = raw.get_column(col)
    cast = s.cast(pl.Float64, strict=False)
    if (cast.is_null() & s.is_not_null()).any():
        example = s.filter(cast.is_null() & s.is_not_null()).head(1).to_list()
        raise DiagnoseError(
            f"{path}: duration column {col!r} holds non-numbers such as {example};"
            f" map a numeric column with --columns duration=COL"
        )
    return (pl.col(col).cast(pl.Float64, strict=False) * scale).alias("duration_s")


def _melt_wide(raw: pl.DataFrame, path: Path, rank_col: str, step_col: str, sections: str | None) -> pl.DataFrame:
    """Wide monitor output (one column per section) to the long frame; unit suffixes are converted and dropped."""
    if sections:
        cols = sections.replace(";", "+").split("+")
    else:
        cols = [
            c
            for c in raw.columns
            if c not in (rank_col, step_col) and raw.schema[c].is_numeric() and c.lower().strip() not in _NOT_SECTIONS
        ]
    if not cols:
        raise DiagnoseError(
            f"{path}: no duration column and no per-section columns; columns found: {raw.columns};"
            f" {_FIX}, or list wide sections with --columns sections=data+forward+backward"
        )
    parts = []
    for c in cols:
        name, factor = c, 1.0
        for suffix, f in _UNIT_SUFFIX.items():
            if c.lower().endswith(suffix) and len(c) > len(suffix):
                name, factor = c[: -len(suffix)], f
                break
        parts.append(
            raw.select(
                _int_column(raw, path, rank_col, "rank"),
                _int_column(raw, path, step_col, "step"),
                pl.lit(name).alias("section"),
                _float_column(raw, path, c, factor),
            )
        )
    return pl.concat(parts)


def _finish(long: pl.DataFrame, path: Path) -> pl.DataFrame:
    """Drop rows without a duration, refuse negative durations, sort by section, rank, step."""
    long = long.filter(
        pl.col("duration_s").is_not_null()
        & pl.col("duration_s").is_not_nan()
        & pl.col("rank").is_not_null()
        & pl.col("step").is_not_null()
    )
    if long.height == 0:
        raise DiagnoseError(f"{path}: no rows with a rank, a step and a duration; check the file or --columns")
    negative = int((long["duration_s"] < 0).sum())
    if negative:
        raise DiagnoseError(
            f"{path}: {negative} negative duration(s) in the duration column; durations must be"
            " >= 0 (map the right column with --columns duration=COL)"
        )
    return long.sort("section", "rank", "step")
