"""Job traces: one canonical schema, readers for public trace formats, a synthetic generator.

``load_trace("philly")`` reads the bundled Microsoft Philly trace; ``load_trace(path)`` reads CSV or
Parquet. ``load_inference("genai", pool_servers=96, until_s=...)`` gives the inference load (servers
needed over time) that capacity loaning works against. Names are imported on first use so that
``import gpufleet.traces`` stays light.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.traces.columns import parse_columns
    from gpufleet.traces.convert import write_trace
    from gpufleet.traces.inference import InferenceLoad, diurnal_load, genai_load, load_inference, read_load_csv
    from gpufleet.traces.info import trace_info
    from gpufleet.traces.load import TraceLoad, bundled_trace_path, load_trace
    from gpufleet.traces.readers import TraceReader, get_reader, reader_names, register_reader
    from gpufleet.traces.schema import CANONICAL_COLUMNS, JOB_SCHEMA, ORIGIN_KEY, POLARS_SCHEMA
    from gpufleet.traces.synthetic import (
        PHILLY_GPU_MIX,
        arrival_profile,
        generate_jobs,
        mean_duration_s,
        plan_load,
        rate_for_load,
        window_load,
    )

_EXPORTS = {
    "CANONICAL_COLUMNS": "schema",
    "JOB_SCHEMA": "schema",
    "ORIGIN_KEY": "schema",
    "POLARS_SCHEMA": "schema",
    "TraceLoad": "load",
    "load_trace": "load",
    "bundled_trace_path": "load",
    "parse_columns": "columns",
    "TraceReader": "readers",
    "get_reader": "readers",
    "reader_names": "readers",
    "register_reader": "readers",
    "trace_info": "info",
    "write_trace": "convert",
    "PHILLY_GPU_MIX": "synthetic",
    "arrival_profile": "synthetic",
    "generate_jobs": "synthetic",
    "mean_duration_s": "synthetic",
    "rate_for_load": "synthetic",
    "plan_load": "synthetic",
    "window_load": "synthetic",
    "InferenceLoad": "inference",
    "genai_load": "inference",
    "diurnal_load": "inference",
    "read_load_csv": "inference",
    "load_inference": "inference",
}

__all__ = [
    "CANONICAL_COLUMNS",
    "JOB_SCHEMA",
    "ORIGIN_KEY",
    "PHILLY_GPU_MIX",
    "POLARS_SCHEMA",
    "InferenceLoad",
    "TraceLoad",
    "TraceReader",
    "arrival_profile",
    "bundled_trace_path",
    "diurnal_load",
    "genai_load",
    "generate_jobs",
    "get_reader",
    "load_inference",
    "load_trace",
    "mean_duration_s",
    "parse_columns",
    "plan_load",
    "rate_for_load",
    "read_load_csv",
    "reader_names",
    "register_reader",
    "trace_info",
    "window_load",
    "write_trace",
]


def __getattr__(name: str) -> Any:
    """Import the defining submodule on first access of a public name."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"gpufleet.traces.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
