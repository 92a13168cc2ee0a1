"""Write a trace in canonical form: Parquet (with the origin in its metadata) or plain CSV.

Parquet is the exchange format between stages; loading what ``write_trace`` wrote gives back the
same frame and origin.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import polars as pl

from gpufleet.errors import TraceError
from gpufleet.traces.load import TraceLoad
from gpufleet.traces.schema import (
    CANONICAL_COLUMNS,
    ORIGIN_KEY,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    conform_jobs,
    job_schema,
    origin_to_metadata,
)

FORMATS = ("parquet", "csv")


def _format_for(path: Path, format: str | None) -> str:
    if format is not None:
        if format not in FORMATS:
            raise TraceError(f"{path}: unknown trace format '{format}'; use one of: {', '.join(FORMATS)}")
        return format
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".csv"):
        return "csv"
    raise TraceError(f"{path}: cannot tell the output format from the suffix; use .parquet or .csv")


def write_trace(
    jobs: pl.DataFrame | TraceLoad,
    path: str | Path,
    format: str | None = None,
    origin: datetime | None = None,
) -> Path:
    """Write canonical ``jobs`` to ``path`` and return the path.

    ``format`` is "parquet" (canonical columns then extras, origin in the metadata key
    ``gpufleet.origin``) or "csv" (canonical columns only; the origin is not kept); None picks it
    from the suffix. A TraceLoad passes its own origin unless ``origin`` is given.
    """
    if isinstance(jobs, TraceLoad):
        origin = origin if origin is not None else jobs.origin
        jobs = jobs.jobs
    path = Path(path)
    fmt = _format_for(path, format)
    try:
        frame = conform_jobs(jobs)
    except KeyError as exc:
        raise TraceError(
            f"{path}: cannot write a trace without canonical columns {exc.args[0]}; load it with load_trace"
        ) from None
    except pl.exceptions.PolarsError as exc:
        raise TraceError(f"{path}: columns do not have canonical types ({exc}); load it with load_trace") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        frame.select(CANONICAL_COLUMNS).write_csv(path)
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = frame.to_arrow()
    canonical = job_schema()
    extras = [table.schema.field(name) for name in table.column_names[len(CANONICAL_COLUMNS) :]]
    extras = [f.with_type(pa.string()) if f.type == pa.large_string() else f for f in extras]
    try:
        table = table.cast(pa.schema(list(canonical) + extras))
    except (ValueError, pa.ArrowException) as exc:
        raise TraceError(
            f"{path}: the jobs frame is not a valid trace ({exc}); required columns "
            "job_id, submit_s, duration_s, num_gpus, kind must have no nulls. Load it with load_trace"
        ) from None
    table = table.replace_schema_metadata({ORIGIN_KEY: origin_to_metadata(origin), SCHEMA_VERSION_KEY: SCHEMA_VERSION})
    pq.write_table(table, path, compression="zstd")
    return path
