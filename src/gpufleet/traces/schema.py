"""The canonical job-trace schema: one row per job, the same columns whatever the source.

Every reader produces this shape and every consumer (simulator, info, generator) reads it, so the
column names, dtypes and their order live here and nowhere else.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    import pyarrow as pa

#: Parquet key-value metadata key holding the trace origin: the absolute time of ``submit_s == 0``
#: as an ISO-8601 string (empty when the trace has no absolute clock).
ORIGIN_KEY = "gpufleet.origin"
#: Parquet key-value metadata key with the version of this schema.
SCHEMA_VERSION_KEY = "gpufleet.trace_schema"
SCHEMA_VERSION = "1"

#: Job kinds a trace may carry; ``"train"`` is the default when a source has no kind column.
KINDS = ("train", "inference")
DEFAULT_KIND = "train"

#: The canonical schema as Polars dtypes (the in-memory form of a trace), columns in order. Extra
#: columns from a source follow these. ``JOB_SCHEMA`` is the same as a pyarrow schema (on disk).
POLARS_SCHEMA: dict[str, pl.DataType] = {
    "job_id": pl.String(),
    "submit_s": pl.Float64(),
    "duration_s": pl.Float64(),
    "num_gpus": pl.Int32(),
    "gpu_type": pl.String(),
    "user": pl.String(),
    "vc": pl.String(),
    "kind": pl.String(),
}

CANONICAL_COLUMNS: tuple[str, ...] = tuple(POLARS_SCHEMA)
#: Meaning of each canonical column (used by docs and ``--help``).
COLUMN_DOCS: dict[str, str] = {
    "job_id": "unique job id within the trace",
    "submit_s": "submit time, seconds since the trace origin",
    "duration_s": "run time at full speed, seconds (> 0)",
    "num_gpus": "GPUs the job asks for (> 0)",
    "gpu_type": "GPU catalog key, or null for any type",
    "user": "submitting user, or null",
    "vc": "virtual cluster (Philly's 'cluster'), or null",
    "kind": "'train' (default) or 'inference'",
}
#: Columns that must be present and non-null in every valid row.
REQUIRED_COLUMNS: tuple[str, ...] = ("job_id", "submit_s", "duration_s", "num_gpus")


def empty_jobs() -> pl.DataFrame:
    """An empty canonical frame (a trace with no jobs)."""
    return pl.DataFrame(schema=POLARS_SCHEMA)


def jobs_from_arrays(
    submit: Any,
    duration: Any,
    num_gpus: Any,
    *,
    prefix: str,
    vc: str | None = None,
    kind: str = DEFAULT_KIND,
    extra: dict[str, pl.Series] | None = None,
) -> pl.DataFrame:
    """A canonical frame of generated jobs: ids ``<prefix>-000..``, no GPU type or user, one ``vc`` and ``kind``
    for all, and ``extra`` columns after the canonical ones."""
    frame = pl.DataFrame({"submit_s": submit, "duration_s": duration, "num_gpus": num_gpus, **(extra or {})})
    width = len(str(max(frame.height - 1, 0)))
    return frame.select(
        (pl.lit(f"{prefix}-") + pl.int_range(pl.len()).cast(pl.String).str.zfill(width)).alias("job_id"),
        "submit_s",
        "duration_s",
        "num_gpus",
        pl.lit(None, dtype=pl.String).alias("gpu_type"),
        pl.lit(None, dtype=pl.String).alias("user"),
        pl.lit(vc, dtype=pl.String).alias("vc"),
        pl.lit(kind, dtype=pl.String).alias("kind"),
        *(extra or {}),
    ).cast(POLARS_SCHEMA)  # type: ignore[arg-type]


def conform_jobs(jobs: pl.DataFrame) -> pl.DataFrame:
    """Cast canonical columns to their dtypes and put them first, extras after, in their order.

    Raises KeyError naming the missing canonical columns; callers turn that into a TraceError
    naming the file.
    """
    missing = [c for c in CANONICAL_COLUMNS if c not in jobs.columns]
    if missing:
        raise KeyError(", ".join(missing))
    extras = [c for c in jobs.columns if c not in POLARS_SCHEMA]
    return jobs.select(
        *[pl.col(c).cast(dtype) for c, dtype in POLARS_SCHEMA.items()],
        *extras,
    )


def sort_jobs(jobs: pl.DataFrame) -> pl.DataFrame:
    """Sort a trace the canonical way: by submit time, ties broken by job_id."""
    return jobs.sort(["submit_s", "job_id"], maintain_order=True)


def origin_to_metadata(origin: datetime | None) -> str:
    """Serialise a trace origin for Parquet metadata (ISO string, empty when there is none)."""
    return "" if origin is None else origin.isoformat()


def origin_from_metadata(value: str | bytes | None) -> datetime | None:
    """Parse the origin stored by :func:`origin_to_metadata`; None when absent or empty."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    text = text.strip()
    return datetime.fromisoformat(text) if text else None


def job_schema() -> pa.Schema:
    """The canonical schema as a pyarrow schema (built on first use: pyarrow is slow to import)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("job_id", pa.string(), nullable=False),
            pa.field("submit_s", pa.float64(), nullable=False),
            pa.field("duration_s", pa.float64(), nullable=False),
            pa.field("num_gpus", pa.int32(), nullable=False),
            pa.field("gpu_type", pa.string()),
            pa.field("user", pa.string()),
            pa.field("vc", pa.string()),
            pa.field("kind", pa.string(), nullable=False),
        ]
    )


def __getattr__(name: str) -> Any:
    """``JOB_SCHEMA`` is computed lazily so that reading CSV never imports pyarrow."""
    if name == "JOB_SCHEMA":
        return job_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
