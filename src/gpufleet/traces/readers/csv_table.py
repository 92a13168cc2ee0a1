"""The ``csv`` trace reader: any CSV, with a column mapping or recognisable column names."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpufleet.traces.canonical import ParsedTable, parse_table
from gpufleet.traces.columns import resolve_columns
from gpufleet.traces.readers import TraceReader, job_id_prefix, read_csv_table, register_reader


@register_reader("csv")
class CsvReader(TraceReader):
    """Any CSV with a column mapping, or with recognisable column names (see ``columns.AUTO_NAMES``).

    Submit may be numeric seconds (kept as is) or datetimes (seconds after the earliest valid job).
    Without a job_id column, ids are ``<file stem>-<row index>``.
    """

    description = "any CSV; map columns with --columns submit=...,duration=...,gpus=..."
    suffixes = (".csv", ".csv.gz")

    @classmethod
    def write_sample(cls, folder: Path) -> Path:
        path = folder / "tiny-jobs.csv"
        path.write_text("job_id,submit_s,duration_s,gpus\na,0,3600,8\nb,60,600,1\nc,120,60,2\n")
        return path

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> ParsedTable:
        table = read_csv_table(path)
        mapping = resolve_columns(table.columns, columns, path=str(path))
        return parse_table(table, mapping, job_id_prefix=job_id_prefix(path), drop_blank=True)
