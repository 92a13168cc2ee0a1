"""Training software stacks: their names, nearest relatives and usual settings, and the constants each resolves to.

The registry is ``gpufleet/data/perf_stacks.toml``; fitted per-stack constants live in the efficiency file
(``[stack.<name>]``). ``resolve_stack`` walks the ``relative`` chain until a stack with fitted constants,
and says when it had to: a stack with no calibration row borrows its nearest relative's constants.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.errors import SpecError
from gpufleet.spec._toml import read_toml
from gpufleet.spec.catalog import data_file

if TYPE_CHECKING:
    from gpufleet.perf.efficiency import Efficiency, StackConstants

__all__ = ["REFERENCE_STACK", "Stack", "get_stack", "resolve_stack", "stack_names"]

#: The stack whose constants are the generation constants themselves (compute factor 1, never fitted).
REFERENCE_STACK = "megatron-core"


@dataclass(frozen=True)
class Stack:
    """One training stack: what it is, its nearest relative, and the settings ``--stack`` applies."""

    name: str
    description: str
    relative: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    recompute: tuple[str, ...] = ("none", "selective", "full")  # the recomputation modes the stack offers
    interleaved: bool = True  # whether it has an interleaved (virtual-stage) pipeline schedule


@functools.cache
def _registry() -> dict[str, Stack]:
    data = read_toml(data_file("perf_stacks.toml"), what="stack registry")
    out = {}
    for name, entry in (data.get("stacks") or {}).items():
        out[name] = Stack(
            name,
            entry.get("description", ""),
            entry.get("relative"),
            dict(entry.get("options", {})),
            tuple(entry.get("recompute", ("none", "selective", "full"))),
            bool(entry.get("interleaved", True)),
        )
    return out


def stack_names() -> list[str]:
    """Names of the known stacks, sorted."""
    return sorted(_registry())


def get_stack(name: str) -> Stack:
    """A stack by name; SpecError lists the known ones."""
    reg = _registry()
    if name not in reg:
        raise SpecError(f"unknown training stack {name!r}; --stack takes one of {', '.join(sorted(reg))}")
    return reg[name]


def resolve_stack(name: str | None, efficiency: Efficiency) -> tuple[StackConstants | None, str, str]:
    """(constants, the stack they belong to, a note) for stack ``name`` under ``efficiency``.

    ``None`` or the reference stack gives ``(None, reference, "")``: the generation constants as they are.
    A stack without fitted constants falls back along its ``relative`` chain; the note says so.
    """
    if name is None or name == REFERENCE_STACK:
        return None, REFERENCE_STACK, ""
    get_stack(name)
    seen = [name]
    current: str | None = name
    while current is not None and current != REFERENCE_STACK:
        fitted = efficiency.stack.get(current)
        if fitted is not None:
            note = "" if current == name else f"stack {name!r} has no fitted constants; using its relative {current!r}"
            return fitted, current, note
        current = get_stack(current).relative
        if current in seen:
            raise SpecError(f"perf_stacks.toml: the relatives of {name!r} form a cycle ({' -> '.join(seen)})")
        if current is not None:
            seen.append(current)
    return None, REFERENCE_STACK, f"stack {name!r} has no fitted constants; using the reference {REFERENCE_STACK!r}"
