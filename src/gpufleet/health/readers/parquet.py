"""The ``parquet`` telemetry reader: a Parquet file, wide or long."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health.frame import TelemetryRead
from gpufleet.health.readers import TelemetryReader, register_reader
from gpufleet.health.readers.tables import table_to_read


@register_reader("parquet")
class ParquetReader(TelemetryReader):
    """A Parquet file, wide or long like the csv reader; canonical files written by gpufleet read back as is."""

    description = "Parquet, wide or long (canonical files written by gpufleet read back unchanged)"
    suffixes = (".parquet", ".pq")

    @classmethod
    def write_sample(cls, folder: Path) -> Path:
        path = folder / "tiny-telemetry.parquet"
        pl.DataFrame(
            {
                "gpu": [0, 1, 0, 1, 0, 1],
                "time": [1714996800 + 60 * k for k in range(3) for _ in range(2)],
                "field": ["DCGM_FI_DEV_GPU_TEMP"] * 6,
                "value": [40.0, 41.0, 40.5, 41.5, 40.0, 42.0],
            }
        ).write_parquet(path)
        return path

    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> TelemetryRead:
        try:
            table = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
            raise HealthError(f"{path}: not a readable Parquet file ({exc}); check the file") from None
        return table_to_read(table, path, columns)
