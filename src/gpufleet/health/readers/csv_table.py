"""The ``csv`` telemetry reader: a CSV, wide or long."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health.frame import TelemetryRead
from gpufleet.health.readers import TelemetryReader, register_reader
from gpufleet.health.readers.tables import table_to_read


@register_reader("csv")
class CsvReader(TelemetryReader):
    """A CSV (optionally gzipped), wide (one column per DCGM field, names or aliases) or long
    (``gpu,host,time,field,value``). Map other column names with ``--columns time=timestamp,gpu=gpu_id``."""

    description = "CSV, wide (one column per DCGM field) or long (gpu,host,time,field,value)"
    suffixes = (".csv", ".csv.gz", ".tsv")

    @classmethod
    def write_sample(cls, folder: Path) -> Path:
        path = folder / "tiny-telemetry.csv"
        rows = [f"2024-05-06T12:0{k}:00Z,node-1,{g},{40 + g},{100 + k}" for k in range(3) for g in range(2)]
        path.write_text("time,hostname,gpu,DCGM_FI_DEV_GPU_TEMP,DCGM_FI_DEV_POWER_USAGE\n" + "\n".join(rows) + "\n")
        return path

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> TelemetryRead:
        try:
            table = pl.read_csv(
                path,
                infer_schema_length=10000,
                encoding="utf8-lossy",
                raise_if_empty=True,
                separator="\t" if path.name.lower().endswith(".tsv") else ",",
            )
        except pl.exceptions.NoDataError:
            raise HealthError(f"{path}: the file is empty; a telemetry CSV needs a header line and rows") from None
        except (pl.exceptions.PolarsError, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise HealthError(f"{path}: not a readable CSV file ({first}); check the format and encoding") from None
        return table_to_read(table, path, columns)
