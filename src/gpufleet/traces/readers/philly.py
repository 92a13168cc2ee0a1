"""The ``philly`` trace reader: Microsoft Philly job-level CSV (the Pollux derivation)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpufleet.traces.canonical import ParsedTable, parse_table
from gpufleet.traces.columns import resolve_columns
from gpufleet.traces.readers import (
    PHILLY_COLUMNS,
    PHILLY_MAPPING,
    TraceReader,
    csv_header,
    read_csv_table,
    register_reader,
)


@register_reader("philly")
class PhillyReader(TraceReader):
    """Microsoft Philly job-level CSV: ``timestamp,duration,num_gpus,gpu_time,cluster``.

    ``timestamp`` becomes submit_s (seconds after the earliest job, which is the origin), ``cluster``
    becomes vc, and job ids are ``philly-<row index in the file>``.
    """

    description = "Microsoft Philly job-level CSV (timestamp,duration,num_gpus,gpu_time,cluster)"
    suffixes = (".csv", ".csv.gz")

    @classmethod
    def sniff(cls, path: Path) -> bool | None:
        """A CSV whose header is exactly Philly's."""
        return tuple(csv_header(path)) == PHILLY_COLUMNS

    @classmethod
    def write_sample(cls, folder: Path) -> Path:
        path = folder / "tiny-philly.csv"
        path.write_text(",".join(PHILLY_COLUMNS) + "\n0,3600,8,28800,vc1\n60,600,1,600,vc2\n120,60,2,120,vc1\n")
        return path

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> ParsedTable:
        table = read_csv_table(path)
        mapping = resolve_columns(table.columns, columns, path=str(path), defaults=PHILLY_MAPPING, layout="philly")
        return parse_table(table, mapping, job_id_prefix="philly", drop_blank=True)
