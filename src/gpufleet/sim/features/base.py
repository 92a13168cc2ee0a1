"""The hooks through which the event core calls a feature; every hook is a no-op unless a feature overrides it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

    from gpufleet.sim.partition import Allocation


class Feature:
    """One switchable part of the engine. The core only calls the hooks a feature overrides:

    - ``start_speed``: a job starts on ``alloc``; returns its speed (the core's is the placement penalty's);
    - ``on_stop``: a running job stops (finishes, is preempted or interrupted), before it releases its GPUs;
    - ``end_pass``: the scheduling pass at ``now`` is over (re-rate running jobs, record, ...);
    - ``next_time`` / ``apply``: external events (node outages, load changes): the core advances to the
      earliest ``next_time`` of all features and calls ``apply``, which returns the feature's next time;
    - ``wake_time`` / ``end_step``: periodic rounds (elastic scaling): the core wakes at ``wake_time`` and
      calls ``end_step`` after every step, changed or not (the elastic core only, for now);
    - ``job_columns`` / ``summary``: what the feature adds to the result frames and the summary row.
    """

    name = "feature"

    def bind(self, sim: Any) -> None:
        """``sim``: the event core (``gpufleet.sim.engine.Simulator``), whose state the feature reads and moves."""
        self.sim = sim

    def start_speed(self, j: int, p: int, alloc: Allocation, speed: float) -> float:
        return speed

    def on_stop(self, j: int, now: float) -> None:
        return None

    def end_pass(self, now: float) -> None:
        return None

    def next_time(self) -> float:
        return math.inf

    def apply(self, now: float) -> float:
        return math.inf

    def wake_time(self) -> float:
        return math.inf

    def end_step(self, now: float) -> None:
        return None

    def job_columns(self) -> dict[str, Any]:
        return {}

    def summary(self, jobs: pl.DataFrame, timeline: pl.DataFrame) -> dict[str, Any]:
        return {}


def overrides(feature: Feature, hook: str) -> bool:
    """True when ``feature`` implements ``hook`` itself (the core skips features that do not)."""
    return getattr(type(feature), hook) is not getattr(Feature, hook)
