"""gpufleet's own exception types: errors a user can cause, each with a message naming the file, field and fix.

The CLI prints these in one line and exits non-zero, without a traceback.
"""

from __future__ import annotations


class GpufleetError(Exception):
    """Base of every error a user can cause through bad input."""


class SpecError(GpufleetError):
    """A cluster file, catalog entry or other specification is invalid."""


class TraceError(GpufleetError):
    """A job trace cannot be read: missing file, missing column, unknown reader."""


class ConfigError(GpufleetError):
    """An option or combination of options is invalid (unknown policy, bad --opt value, ...)."""


class DiagnoseError(GpufleetError):
    """A profiler trace or timing file cannot be read or analysed (truncated JSON, missing column, ...)."""


class HealthError(GpufleetError):
    """Telemetry or a failure model cannot be read or used (missing field, unknown format, bad model file)."""


class MetaError(GpufleetError):
    """Interactions, task records or a meta-learning checkpoint cannot be read or used (bad row, missing column)."""


class ServeError(GpufleetError):
    """A model folder, adapter or serving request cannot be used (missing weights, unknown adapter, bad shape)."""
