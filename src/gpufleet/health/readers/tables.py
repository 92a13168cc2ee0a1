"""Wide or long telemetry tables (the csv and parquet readers' shared parsing): roles, renames, pivot."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health.fields import canonical_name
from gpufleet.health.frame import (
    DEV,
    HOST,
    KEY_COLUMNS,
    META_COLUMNS,
    TelemetryRead,
    assemble,
    long_to_wide,
    name_map,
    to_utc_ms,
)

#: Source column names recognised without a mapping (case-insensitive, first match wins).
AUTO_COLUMNS: dict[str, tuple[str, ...]] = {
    "time": ("time", "timestamp", "ts", "datetime", "date_time"),
    "gpu": ("gpu", "gpu_id", "gpu_index", "gpu_idx", "device_id"),
    "host": ("hostname", "host", "node_name", "instance", "node"),
    "uuid": ("uuid", "gpu_uuid"),
    "pci_bus_id": ("pci_bus_id", "pci", "bus_id", "pci_id"),
    "model": ("model", "modelname", "gpu_model", "model_name"),
    "field": ("field", "metric", "metric_name", "__name__", "field_name"),
    "value": ("value", "val", "metric_value"),
}
_ROLES = tuple(AUTO_COLUMNS)


def _resolve_roles(names: list[str], columns: Mapping[str, str] | None, where: str) -> dict[str, str]:
    """Role (time, gpu, host, ...) → source column, from ``columns`` first and then by auto-detection."""
    lower = {n.lower(): n for n in reversed(names)}
    given = dict(columns or {})
    roles: dict[str, str] = {}
    for key, source in given.items():
        role = key.strip().lower()
        if role not in _ROLES:
            continue
        if source not in names:
            raise HealthError(
                f"{where}: --columns {key}={source}: the file has no column '{source}'; columns are: {', '.join(names)}"
            )
        roles[role] = source
    for role, candidates in AUTO_COLUMNS.items():
        if role not in roles:
            found = next((lower[c] for c in candidates if c in lower), None)
            if found is not None and found not in roles.values():
                roles[role] = found
    return roles


def _require(roles: dict[str, str], role: str, names: list[str], where: str, layout: str) -> str:
    if role not in roles:
        tried = ", ".join(AUTO_COLUMNS[role])
        raise HealthError(
            f"{where}: no '{role}' column for a {layout} telemetry table (looked for {tried}); columns are: "
            f"{', '.join(names)}; name it with --columns {role}=<source column>"
        )
    return roles[role]


def _device_columns(table: pl.DataFrame, roles: dict[str, str], where: str, layout: str) -> list[pl.Expr]:
    names = table.columns
    if "gpu" not in roles and "uuid" not in roles:
        _require(roles, "gpu", names, where, layout)
    host = pl.col(roles["host"]) if "host" in roles else pl.lit("")
    dev = pl.col(roles["gpu"]) if "gpu" in roles else pl.lit(None, dtype=pl.Int64)
    exprs = [host.alias(HOST), dev.alias(DEV)]
    exprs += [pl.col(roles[m]).cast(pl.String).alias(m) for m in ("uuid", "pci_bus_id", "model") if m in roles]
    return exprs


def table_to_read(table: pl.DataFrame, path: Path, columns: Mapping[str, str] | None) -> TelemetryRead:
    """A wide or long table as a canonical read; ``columns`` names roles and renames fields."""
    where = str(path)
    names = table.columns
    roles = _resolve_roles(names, columns, where)
    renames = {source: target for target, source in (columns or {}).items() if target.strip().lower() not in _ROLES}
    for source in renames:
        if source not in names:
            raise HealthError(
                f"{where}: --columns {renames[source]}={source}: the file has no column '{source}'; columns are: "
                f"{', '.join(names)}"
            )
    host_is_name = "host" in roles and table.schema[roles["host"]] == pl.String
    long = "field" in roles and "value" in roles
    layout = "long" if long else "wide"
    time_col = _require(roles, "time", names, where, layout)
    time = to_utc_ms(table[time_col], f"{where} column '{time_col}'").alias("time")
    ids = _device_columns(table, roles, where, layout)
    if long:
        frame = table.select(
            *ids,
            time,
            pl.col(roles["field"]).cast(pl.String).alias("field"),
            pl.col(roles["value"]).cast(pl.Float64, strict=False).alias("value"),
        )
        frame = frame.with_columns(pl.col("field").replace(name_map(frame["field"])))
        wide = long_to_wide(frame.filter(pl.col("field").is_not_null()))
        return assemble(wide, where, host_is_name=host_is_name)
    if "field" in roles or "value" in roles:
        missing = "value" if "field" in roles else "field"
        _require(roles, missing, names, where, "long")
    used = set(roles.values()) | {n for n in names if n in (*KEY_COLUMNS, *META_COLUMNS)}  # codes are recomputed
    fields: dict[str, list[str]] = {}
    for name in names:
        if name in used:
            continue
        target = renames.get(name) or name
        canonical = canonical_name(target)
        numeric = table.schema[name].is_numeric() or (
            table[name].cast(pl.Float64, strict=False).null_count() == table[name].null_count()
        )
        if canonical is None and not numeric:
            continue  # a non-numeric column outside the catalog (a driver version, a pod name): dropped
        fields.setdefault(canonical or target, []).append(name)
    exprs = [
        pl.coalesce([pl.col(s).cast(pl.Float64, strict=False) for s in sources]).alias(name)
        for name, sources in fields.items()
    ]
    wide = table.select(*ids, time, *exprs)
    return assemble(wide, where, host_is_name=host_is_name)
