"""The DCGM field catalog: names, numeric ids, kinds and units of the telemetry fields gpufleet reads.

The single source of truth is ``gpufleet/data/health/dcgm_fields.csv`` (ids and names checked against
``dcgmlib/dcgm_fields.h`` of DCGM 4.6). Every field is known by its *legacy* DCGM name (the one
dcgm-exporter's ``default-counters.csv`` and most dashboards use, e.g. ``DCGM_FI_DEV_GPU_TEMP``), which is
the canonical column name in gpufleet's telemetry frames; newer DCGM names (``DCGM_FI_DEV_GPU_TEMP_CELSIUS``)
are aliases.

Kinds decide how a field is resampled and typed:

- ``gauge``: an instantaneous value (Float32; hourly mean);
- ``counter``: a cumulative count or a 0/1 state flag (Float32; hourly max, the last value of a
  monotone counter, and "was set at any time in the hour" for a flag);
- ``bitmask``: a bit field such as the clock-event reasons (Int64; hourly bitwise OR);
- ``xid``: an XID error code (Int64, 0 = none; hourly the most severe code, see :mod:`gpufleet.health.xid`).
"""

from __future__ import annotations

import csv
import difflib
import io
from dataclasses import dataclass
from enum import IntFlag
from functools import cache
from importlib import resources

from gpufleet.errors import HealthError

#: The kinds a field may have.
KINDS = ("gauge", "counter", "bitmask", "xid")

_CATALOG = "dcgm_fields.csv"


@dataclass(frozen=True)
class Field:
    """One DCGM field: legacy ``name`` (the canonical column name), numeric ``id``, ``kind``, ``unit``."""

    name: str
    id: int
    kind: str
    unit: str
    help: str
    aliases: tuple[str, ...] = ()

    @property
    def is_integer(self) -> bool:
        """True for bitmask and XID fields, which frames hold as Int64 rather than Float32."""
        return self.kind in ("bitmask", "xid")


class ClockEventReason(IntFlag):
    """Bits of ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` (``DCGM_CLOCKS_EVENT_REASON_*`` in dcgm_fields.h)."""

    GPU_IDLE = 0x1
    CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL = 0x20
    HW_THERMAL = 0x40
    HW_POWER_BRAKE = 0x80
    DISPLAY_CLOCKS = 0x100


#: The clock-event bits that point at hardware trouble (slowdown, thermal, power brake).
HW_CLOCK_EVENTS = ClockEventReason.HW_SLOWDOWN | ClockEventReason.HW_THERMAL | ClockEventReason.HW_POWER_BRAKE


def _parse_catalog(text: str, source: str) -> tuple[Field, ...]:
    fields: list[Field] = []
    for line, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        try:
            kind = row["kind"].strip()
            if kind not in KINDS:
                raise ValueError(f"kind '{kind}' is not one of {', '.join(KINDS)}")
            aliases = tuple(a.strip() for a in (row["aliases"] or "").split(";") if a.strip())
            fields.append(
                Field(
                    name=row["name"].strip(),
                    id=int(row["id"]),
                    kind=kind,
                    unit=(row["unit"] or "").strip(),
                    help=(row["help"] or "").strip(),
                    aliases=aliases,
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise HealthError(f"{source} line {line}: invalid field entry ({exc}); fix that row") from None
    return tuple(fields)


@cache
def _load() -> tuple[tuple[Field, ...], dict[str, Field], dict[int, Field]]:
    resource = resources.files("gpufleet").joinpath("data", "health", _CATALOG)
    fields = _parse_catalog(resource.read_text(encoding="utf-8"), f"gpufleet/data/health/{_CATALOG}")
    by_name: dict[str, Field] = {}
    by_id: dict[int, Field] = {}
    for f in fields:
        for key in (f.name, *f.aliases):
            if key in by_name:
                raise HealthError(f"gpufleet/data/health/{_CATALOG}: name {key} is listed twice; remove one")
            by_name[key] = f
        if f.id in by_id:
            raise HealthError(f"gpufleet/data/health/{_CATALOG}: id {f.id} is listed twice; remove one")
        by_id[f.id] = f
    return fields, by_name, by_id


def _normalise(name: str) -> str:
    return name.strip().upper()


def canonical_name(name: str) -> str | None:
    """The legacy DCGM name for ``name`` (a legacy name or an alias, any case); None when unknown.

    Readers keep an unknown field under its own name, so None is an answer, not an error.
    """
    f = _load()[1].get(_normalise(name))
    return None if f is None else f.name


def field(key: str | int) -> Field:
    """The catalog entry for a legacy name, an alias or a numeric id (``150`` or ``"150"``).

    Raises HealthError with the closest known names when ``key`` is unknown.
    """
    _, by_name, by_id = _load()
    if isinstance(key, int) or (isinstance(key, str) and key.strip().isdigit()):
        found = by_id.get(int(key))
        if found is None:
            known = ", ".join(str(i) for i in sorted(by_id))
            raise HealthError(f"unknown DCGM field id {int(key)}; known ids: {known}")
        return found
    found = by_name.get(_normalise(key))
    if found is not None:
        return found
    close = difflib.get_close_matches(_normalise(key), list(by_name), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else "; see gpufleet/data/health/dcgm_fields.csv"
    raise HealthError(f"unknown DCGM field '{key}'{hint}")


def fields_of_kind(kind: str) -> tuple[Field, ...]:
    """The catalog fields of one kind (``gauge``, ``counter``, ``bitmask`` or ``xid``)."""
    if kind not in KINDS:
        raise HealthError(f"unknown field kind '{kind}'; kinds are {', '.join(KINDS)}")
    return tuple(f for f in _load()[0] if f.kind == kind)


#: Every catalog field, in catalog (id) order.
FIELDS: tuple[Field, ...] = _load()[0]
