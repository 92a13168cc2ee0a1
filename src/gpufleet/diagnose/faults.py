"""Faults the diagnosis test workload can inject, each with the root-cause category a diagnosis should report.

A fault is written ``KIND:RANK[:MAGNITUDE]`` on the command line (``slow-rank:2``, ``slow-data:1:0.05``) or
``none``. This module only parses, describes and performs the host-side parts of faults (Python pauses, sleeps);
the workload decides where in the step each fault acts. Pure Python: no torch import.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass
from typing import Any

from gpufleet.errors import ConfigError

#: fault kind -> (root-cause category, default magnitude, what the magnitude means)
FAULTS: dict[str, tuple[str, float, str]] = {
    "slow-rank": ("compute", 0.5, "extra fraction of every linear's time, forward and backward (throttled device)"),
    "slow-data": ("data_loading", 0.03, "seconds added to each DataLoader batch (sleep in collate)"),
    "python-pause": ("cpu_stall", 0.1, "seconds of pure-Python pause (gc + busy loop) every --pause-every steps"),
    "slow-collective": ("communication", 0.03, "seconds per step the rank delays its all-reduces, spread over buckets"),
    "sync": ("sync", 4.0, "needless host-device synchronisations (.item()) per transformer layer per forward"),
    "hang": ("hang", -1.0, "seconds the rank stays stuck before a collective (default: the collective timeout + 2)"),
    "host-before": ("data_loading", 0.05, "seconds of un-annotated Python work per step before the forward"),
    "host-after": ("cpu_stall", 0.05, "seconds of un-annotated Python pause per step after the optimizer step"),
}


@dataclass(frozen=True)
class Fault:
    """One injected fault: its kind, the rank it hits (None for ``none``) and its magnitude."""

    kind: str = "none"
    rank: int | None = None
    magnitude: float = 0.0

    @property
    def category(self) -> str | None:
        """The root-cause category a correct diagnosis reports (None when no fault is injected)."""
        return FAULTS[self.kind][0] if self.kind in FAULTS else None

    def on(self, rank: int, kind: str) -> bool:
        """True when this fault is of ``kind`` and hits ``rank``."""
        return self.kind == kind and self.rank == rank

    def to_dict(self) -> dict[str, Any]:
        """The ground-truth fields of ``fault.json``."""
        return {**asdict(self), "category": self.category}


def parse_fault(text: str, world_size: int | None = None) -> Fault:
    """Parse ``KIND:RANK[:MAGNITUDE]`` or ``none``; check the rank against ``world_size`` when given."""
    parts = text.strip().split(":")
    kind = parts[0].lower()
    if kind in ("", "none"):
        return Fault()
    if kind not in FAULTS:
        raise ConfigError(f"--fault {text!r}: unknown kind {kind!r}; choose one of none, {', '.join(FAULTS)}")
    if len(parts) not in (2, 3):
        raise ConfigError(f"--fault {text!r}: write KIND:RANK[:MAGNITUDE], e.g. {kind}:1 or {kind}:1:0.05")
    try:
        rank = int(parts[1])
        magnitude = float(parts[2]) if len(parts) == 3 else FAULTS[kind][1]
    except ValueError:
        raise ConfigError(f"--fault {text!r}: RANK must be an integer and MAGNITUDE a number") from None
    if rank < 0 or (world_size is not None and rank >= world_size):
        raise ConfigError(f"--fault {text!r}: rank {rank} is outside 0..{(world_size or 1) - 1}")
    if magnitude < 0 and kind != "hang":
        raise ConfigError(f"--fault {text!r}: magnitude must be >= 0")
    return Fault(kind, rank, magnitude)


def python_pause(seconds: float) -> None:
    """Stall the calling thread in plain Python for ``seconds``: collect a heap of reference cycles, then spin.

    No torch op runs meanwhile, so a profiler sees a gap on the main thread. The garbage is collected with a
    young-generation ``gc.collect(1)`` (a full collection over torch's heap alone takes ~0.1 s, too long to
    control); a busy loop tops the pause up to the requested length.
    """
    end = time.perf_counter() + seconds
    junk: list[Any] = []
    enabled = gc.isenabled()
    gc.disable()  # no automatic full collection while the garbage is built: it could take far longer than asked
    for _ in range(min(5_000, int(seconds * 50_000))):
        a: list[Any] = []
        a.append(a)  # a reference cycle: only the cyclic collector frees it
        junk.append(a)
    del junk
    gc.collect(1)
    if enabled:
        gc.enable()
    x = 0
    while time.perf_counter() < end:
        x += 1


def sleep(seconds: float) -> None:
    """Block the calling thread for ``seconds`` without running any torch op (an I/O or network wait)."""
    if seconds > 0:
        time.sleep(seconds)
