"""The ``parquet`` trace reader: canonical Parquet written by gpufleet, or any mapped Parquet."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import polars as pl

from gpufleet.errors import TraceError
from gpufleet.traces.canonical import ParsedTable, parse_table
from gpufleet.traces.columns import resolve_columns
from gpufleet.traces.readers import TraceReader, job_id_prefix, register_reader
from gpufleet.traces.schema import ORIGIN_KEY, origin_from_metadata


@register_reader("parquet")
class ParquetReader(TraceReader):
    """Canonical Parquet as written by ``write_trace`` (origin in the file's metadata).

    Other Parquet files work too when their columns are recognisable or mapped.
    """

    description = "canonical Parquet written by gpufleet (keeps the trace origin)"
    suffixes = (".parquet",)

    @classmethod
    def write_sample(cls, folder: Path) -> Path:
        path = folder / "tiny-jobs.parquet"
        pl.DataFrame(
            {
                "job_id": ["a", "b", "c"],
                "submit_s": [0.0, 60.0, 120.0],
                "duration_s": [3600.0, 600.0, 60.0],
                "gpus": [8, 1, 2],
            }
        ).write_parquet(path)
        return path

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> ParsedTable:
        import pyarrow.parquet as pq

        try:
            table = pl.read_parquet(path)
            metadata = pq.read_schema(path).metadata or {}
        except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
            raise TraceError(f"{path}: not a readable Parquet file ({exc}); write it with write_trace") from None
        try:
            origin = origin_from_metadata(metadata.get(ORIGIN_KEY.encode()))
        except ValueError:
            raise TraceError(
                f"{path}: metadata {ORIGIN_KEY} is not an ISO datetime; rewrite the file with write_trace"
            ) from None
        mapping = resolve_columns(table.columns, columns, path=str(path))
        parsed = parse_table(table, mapping, job_id_prefix=job_id_prefix(path), drop_blank=False)
        if not parsed.from_datetimes:
            parsed.origin = origin
        return parsed
