"""Trace readers, registered by name so that ``--reader philly`` is a dictionary lookup.

A reader turns one file into a :class:`ParsedTable` (canonical columns, not yet validated). Adding a
format is one small class with ``@register_reader("name")``.
"""

from __future__ import annotations

import csv
import gzip
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import polars as pl

from gpufleet.errors import TraceError
from gpufleet.registry import Registry
from gpufleet.traces.canonical import ParsedTable, parse_table
from gpufleet.traces.columns import resolve_columns
from gpufleet.traces.schema import ORIGIN_KEY, origin_from_metadata

#: Column layout of the Philly job-level trace (Pollux derivation).
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
PHILLY_MAPPING = {"submit": "timestamp", "duration": "duration", "gpus": "num_gpus", "vc": "cluster"}


class TraceReader(ABC):
    """Reads one trace file into canonical columns; validation and sorting happen in the loader."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @abstractmethod
    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> ParsedTable:
        """Read ``path``; ``columns`` maps canonical keys to source columns (None = auto-detect)."""


READERS: Registry[TraceReader] = Registry("trace reader", TraceError, listing="available readers")
register_reader = READERS.register  # class decorator: ``@register_reader("name")``
reader_names = READERS.names  # the registered names, sorted
get_reader = READERS.create  # a new reader by name; TraceError listing the names for an unknown one


def _first_ragged_line(path: Path, width: int) -> int | None:
    """1-based line number of the first CSV record with more fields than the header (error path)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace", newline="") as fh:
            reader = csv.reader(fh)
            for record in reader:
                if len(record) > width:
                    return reader.line_num
    except (OSError, csv.Error):
        return None
    return None


def csv_header(path: Path) -> list[str]:
    """The header fields of a (possibly gzipped) CSV, read cheaply; [] when unreadable."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", errors="replace", newline="") as fh:
            return [c.strip() for c in next(csv.reader(fh), [])]
    except (OSError, csv.Error, EOFError):
        return []


def read_csv_table(path: Path) -> pl.DataFrame:
    """Every field of a CSV as a string (explicit dtypes: nothing is guessed, nothing is lost)."""
    try:
        return pl.read_csv(path, infer_schema=False, encoding="utf8-lossy", raise_if_empty=True)
    except pl.exceptions.NoDataError:
        raise TraceError(f"{path}: the file is empty; a trace CSV needs a header line and rows") from None
    except pl.exceptions.PolarsError as exc:
        message = str(exc)
        if "more fields" in message:
            line = _first_ragged_line(path, len(csv_header(path)))
            where = f" (line {line})" if line else ""
            raise TraceError(
                f"{path}: a row has more fields than the header{where}; fix or quote that line"
            ) from None
        if "not properly escaped" in message:
            column = re.search(r"at column '([^']*)'", message)
            where = f" in column '{column.group(1)}'" if column else ""
            raise TraceError(
                f"{path}: a field{where} has an unmatched double quote; fix the quoting of that line"
            ) from None
        first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
        raise TraceError(
            f"{path}: not a readable CSV file ({first}); check the format and encoding"
        ) from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the file ({exc.strerror or exc})") from None


def _job_id_prefix(path: Path) -> str:
    return path.name.split(".", 1)[0] or "job"


@register_reader("philly")
class PhillyReader(TraceReader):
    """Microsoft Philly job-level CSV: ``timestamp,duration,num_gpus,gpu_time,cluster``.

    ``timestamp`` becomes submit_s (seconds after the earliest job, which is the origin), ``cluster``
    becomes vc, and job ids are ``philly-<row index in the file>``.
    """

    description = "Microsoft Philly job-level CSV (timestamp,duration,num_gpus,gpu_time,cluster)"

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> ParsedTable:
        table = read_csv_table(path)
        mapping = resolve_columns(
            table.columns, columns, path=str(path), defaults=PHILLY_MAPPING, layout="philly"
        )
        return parse_table(table, mapping, job_id_prefix="philly", drop_blank=True)


@register_reader("csv")
class CsvReader(TraceReader):
    """Any CSV with a column mapping, or with recognisable column names (see ``columns.AUTO_NAMES``).

    Submit may be numeric seconds (kept as is) or datetimes (seconds after the earliest valid job).
    Without a job_id column, ids are ``<file stem>-<row index>``.
    """

    description = "any CSV; map columns with --columns submit=...,duration=...,gpus=..."

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> ParsedTable:
        table = read_csv_table(path)
        mapping = resolve_columns(table.columns, columns, path=str(path))
        return parse_table(table, mapping, job_id_prefix=_job_id_prefix(path), drop_blank=True)


@register_reader("parquet")
class ParquetReader(TraceReader):
    """Canonical Parquet as written by ``write_trace`` (origin in the file's metadata).

    Other Parquet files work too when their columns are recognisable or mapped.
    """

    description = "canonical Parquet written by gpufleet (keeps the trace origin)"

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> ParsedTable:
        import pyarrow.parquet as pq

        try:
            table = pl.read_parquet(path)
            metadata = pq.read_schema(path).metadata or {}
        except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
            raise TraceError(
                f"{path}: not a readable Parquet file ({exc}); write it with write_trace"
            ) from None
        try:
            origin = origin_from_metadata(metadata.get(ORIGIN_KEY.encode()))
        except ValueError:
            raise TraceError(
                f"{path}: metadata {ORIGIN_KEY} is not an ISO datetime; rewrite the file with write_trace"
            ) from None
        mapping = resolve_columns(table.columns, columns, path=str(path))
        parsed = parse_table(table, mapping, job_id_prefix=_job_id_prefix(path), drop_blank=False)
        if not parsed.from_datetimes:
            parsed.origin = origin
        return parsed
