"""Load a job trace from any supported source into the canonical schema, with bad rows accounted for.

``load_trace("philly")`` reads the bundled Philly trace; a path picks its reader from the file
suffix (and, for CSV, from the header). The result is a :class:`TraceLoad`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path

import polars as pl

from gpufleet.errors import TraceError
from gpufleet.traces.canonical import ROW, TS
from gpufleet.traces.columns import parse_columns
from gpufleet.traces.readers import detect_reader, get_reader
from gpufleet.traces.schema import conform_jobs, sort_jobs
from gpufleet.traces.validate import validate_jobs

__all__ = ["BUNDLED_PHILLY", "TraceLoad", "bundled_trace_path", "load_trace", "parse_columns"]

#: File name of the bundled Philly trace inside ``gpufleet/data/traces``.
BUNDLED_PHILLY = "philly.csv.gz"
_SUFFIXES = ".parquet, .csv or .csv.gz"


@dataclass
class TraceLoad:
    """A loaded trace: the valid jobs plus an account of everything that was not kept."""

    jobs: pl.DataFrame  # canonical columns (then extras), valid rows only, sorted by submit_s, job_id
    source: str
    reader: str
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> number of rows
    rejected_examples: dict[str, list[int]] = field(default_factory=dict)  # reason -> 0-based data rows
    origin: datetime | None = None  # absolute time of submit_s == 0, when the source has a clock
    rows_read: int = 0  # records in the source (blank lines are not records)
    vc: str | None = None  # the virtual cluster filter that was applied, if any
    rows_other_vcs: int = 0  # rows left out by the vc filter (neither kept nor rejected)

    @property
    def rejected_total(self) -> int:
        """Number of rejected rows over all reasons."""
        return sum(self.rejected.values())

    def rejected_summary(self) -> str:
        """One line describing the rejected rows, e.g. for the CLI; empty when nothing was rejected.

        Row numbers are 0-based data rows: in a CSV with a header, row r is on line r + 2.
        """
        if not self.rejected:
            return ""
        parts = []
        for reason, count in self.rejected.items():
            rows = ", ".join(str(r) for r in self.rejected_examples.get(reason, []))
            more = ", ..." if count > len(self.rejected_examples.get(reason, [])) else ""
            parts.append(f"{reason}: {count} (rows {rows}{more})")
        return f"{self.source}: rejected {self.rejected_total} of {self.rows_read} rows: " + "; ".join(parts)


def bundled_trace_path(name: str = BUNDLED_PHILLY) -> Path:
    """Path of a trace shipped inside the package (``gpufleet/data/traces``)."""
    ref = resources.files("gpufleet").joinpath("data", "traces", name)
    path = Path(str(ref))
    if not path.is_file():
        raise TraceError(f"bundled trace {name} is missing from the gpufleet install; reinstall gpufleet")
    return path


def _pick_reader(path: Path) -> str:
    """Reader name from the readers' suffixes and sniffing (a CSV with exactly the Philly header is philly)."""
    name = detect_reader(path)
    if name is not None:
        return name
    raise TraceError(
        f"{path}: cannot tell the trace format from the suffix; use a {_SUFFIXES} file or pass a reader "
        f"(--reader csv|parquet|philly)"
    )


def _filter_vc(frame: pl.DataFrame, vc: str, source: str) -> pl.DataFrame:
    keep = frame.filter(pl.col("vc") == vc)
    if keep.height:
        return keep
    counts = frame.filter(pl.col("vc").is_not_null()).group_by("vc").len().sort(["len", "vc"], descending=[True, False])
    if counts.height == 0:
        raise TraceError(
            f"{source}: cannot select vc '{vc}': the trace has no vc column values; map a column to vc "
            f"(--columns vc=<column>) or drop --vc"
        )
    listing = ", ".join(f"{v} ({n})" for v, n in zip(counts["vc"], counts["len"], strict=True))
    raise TraceError(f"{source}: no jobs in vc '{vc}'; the trace's vcs (jobs) are: {listing}. Pick one of these")


def load_trace(
    source: str | Path,
    *,
    reader: str | None = None,
    columns: Mapping[str, str] | None = None,
    vc: str | None = None,
) -> TraceLoad:
    """Read a trace into canonical form, keeping valid rows and counting bad ones by reason.

    ``source`` is ``"philly"`` (the bundled Philly trace) or a path. ``reader`` overrides the choice
    by suffix; ``columns`` maps canonical keys (submit, duration, gpus, job_id, gpu_type, user, vc,
    kind, and the optional model) to source columns; ``vc`` keeps one virtual cluster. Raises TraceError
    for problems with the file as a whole (missing, unreadable, missing columns, unknown vc); bad rows
    never raise.
    """
    if isinstance(source, str) and source == "philly":
        path, label, reader = bundled_trace_path(), "philly", reader or "philly"
    else:
        path, label = Path(source), str(source)
        if not path.is_file():
            raise TraceError(
                f"{path}: no such file; pass a {_SUFFIXES} trace, or 'philly' for the bundled Philly trace"
            )
    name = reader or _pick_reader(path)
    try:
        trace_reader = get_reader(name)
    except TraceError as exc:
        raise TraceError(f"{label}: {exc}") from None
    parsed = trace_reader.read(path, columns)
    frame = parsed.frame
    other = 0
    if vc is not None:
        kept = _filter_vc(frame, vc, label)
        other, frame = frame.height - kept.height, kept
    checked = validate_jobs(frame)
    jobs = checked.valid
    origin = parsed.origin
    if parsed.from_datetimes:
        first = jobs[TS].min() if jobs.height else None
        if isinstance(first, datetime):
            origin = first
            since = (pl.col(TS) - pl.lit(first)).dt.total_microseconds().cast(pl.Float64) / 1e6
            jobs = jobs.with_columns(since.alias("submit_s"))
    jobs = sort_jobs(conform_jobs(jobs.drop([c for c in (ROW, TS) if c in jobs.columns])))
    return TraceLoad(
        jobs=jobs,
        source=label,
        reader=name,
        rejected=checked.rejected,
        rejected_examples=checked.rejected_examples,
        origin=origin,
        rows_read=parsed.rows_read,
        vc=vc,
        rows_other_vcs=other,
    )
