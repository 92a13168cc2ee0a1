"""Telemetry readers: DCGM exports in, one canonical wide frame out.

The canonical frame (what the fleet generator writes and every later stage reads) has one row per
(GPU, time), sorted by ``gpu`` then ``time``:

- ``gpu`` UInt32: dense fleet GPU code 0..n-1, in (host, local GPU index, UUID) order;
- ``node`` UInt32: dense code of the host, in host-name order;
- ``time`` Datetime("ms", "UTC");
- one column per field, named by its legacy DCGM name (``DCGM_FI_DEV_GPU_TEMP``), in catalog order:
  Float32 for gauges and counters, Int64 for bitmask fields and ``DCGM_FI_DEV_XID_ERRORS`` (0 = none);
  null where the source had no sample;
- then fields outside the catalog under their own names (Float32, sorted by name; listed in
  :attr:`TelemetryRead.unknown_fields`);
- then, when the source has them, the strings ``hostname``, ``uuid``, ``pci_bus_id`` and ``model``.

Readers are registered by name (``--reader prometheus``), one module of this package each:
``prometheus`` (dcgm-exporter text exposition), ``csv`` and ``parquet`` (wide or long tables). A new
reader is one new module here (the registry imports them all); it declares its ``suffixes`` and may
``sniff`` a file, which is how :func:`detect_reader` picks one. The frame and its helpers are public in
:mod:`gpufleet.health.frame`. Hourly resampling and XID merging live in :mod:`gpufleet.health.hourly`;
their names, and the prometheus module's, stay importable from here. See ``docs/health_telemetry.md``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpufleet import colmap
from gpufleet.errors import HealthError
from gpufleet.health.frame import (  # re-exported: the frame's names stay importable from here
    KEY_COLUMNS as KEY_COLUMNS,
)
from gpufleet.health.frame import (
    META_COLUMNS as META_COLUMNS,
)
from gpufleet.health.frame import (
    TIME_DTYPE as TIME_DTYPE,
)
from gpufleet.health.frame import (
    XID_COLUMN as XID_COLUMN,
)
from gpufleet.health.frame import (
    TelemetryRead as TelemetryRead,
)
from gpufleet.health.frame import (
    canonical_order as canonical_order,
)
from gpufleet.health.frame import (
    to_utc_ms as to_utc_ms,
)
from gpufleet.registry import FileReader, Registry

if TYPE_CHECKING:  # re-exported lazily by __getattr__ below (those modules import this one)
    from gpufleet.health.hourly import merge_xid_events as merge_xid_events
    from gpufleet.health.hourly import most_severe_expr as most_severe_expr
    from gpufleet.health.hourly import resample_hourly as resample_hourly
    from gpufleet.health.readers.prometheus import PrometheusReader as PrometheusReader
    from gpufleet.health.readers.prometheus import file_time as file_time
    from gpufleet.health.readers.prometheus import parse_exposition as parse_exposition


class TelemetryReader(FileReader, ABC):
    """Reads one telemetry file (or folder) into a :class:`TelemetryRead`."""

    kind: ClassVar[str] = "telemetry reader"

    @abstractmethod
    def read(self, path: Path, columns: Mapping[str, str] | None = None) -> TelemetryRead:
        """Read ``path``; ``columns`` maps canonical names (``time``, ``gpu``, a DCGM field) to source columns."""


READERS: Registry[TelemetryReader] = Registry(
    "telemetry reader", HealthError, listing="available readers", package="gpufleet.health.readers"
)
register_reader = READERS.register  # class decorator: ``@register_reader("name")``
reader_names = READERS.names  # the registered names, sorted
get_reader = READERS.create  # a new reader by name; HealthError listing the names for an unknown one


def detect_reader(path: Path) -> str:
    """The reader for ``path``, from the readers' suffixes and sniffing; csv when none claims it.

    Folders and ``.prom``/``.txt`` are prometheus, ``.parquet`` parquet, ``.csv`` csv; other names are
    sniffed (a first line starting with ``#`` or ``DCGM_`` means prometheus).
    """
    return READERS.detect(path, fallback="csv") or "csv"


def read_telemetry(
    path: str | Path, reader: str | None = None, columns: Mapping[str, str] | None = None
) -> TelemetryRead:
    """Read a telemetry export into the canonical frame; ``reader=None`` picks one from the path.

    ``columns`` maps canonical names to source columns (``{"time": "timestamp", "gpu": "gpu_id"}``) for
    the csv and parquet readers; see :func:`parse_column_map` for the CLI form.
    """
    path = Path(path)
    if not path.exists():
        raise HealthError(f"{path}: no such file or folder; pass a dcgm-exporter dump, a CSV or a Parquet file")
    return get_reader(reader or detect_reader(path)).read(path, columns)


def parse_column_map(spec: str) -> dict[str, str]:
    """Parse the CLI form ``"time=timestamp,gpu=gpu_id,DCGM_FI_DEV_GPU_TEMP=temp_c"`` into a mapping (keys kept as
    written: field names are case-sensitive; see :func:`gpufleet.colmap.parse_column_map`)."""
    return colmap.parse_column_map(
        spec,
        error=HealthError,
        example="time=timestamp,gpu=gpu_id,host=node_name",
        pairs="canonical=source",
        lower_keys=False,
    )


# ---------------------------------------------------------------------------------------------------
# names that moved to the prometheus and hourly modules, still importable from here

_MOVED = {
    "PrometheusReader": "gpufleet.health.readers.prometheus",
    "file_time": "gpufleet.health.readers.prometheus",
    "parse_exposition": "gpufleet.health.readers.prometheus",
    "most_severe_expr": "gpufleet.health.hourly",
    "resample_hourly": "gpufleet.health.hourly",
    "merge_xid_events": "gpufleet.health.hourly",
}


def __getattr__(name: str) -> Any:
    """Lazy re-export of :data:`_MOVED` (a lazy one, because those modules import this one)."""
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
