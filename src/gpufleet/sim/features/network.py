"""Network contention as an engine feature: jobs attach to links when they start and detach when they stop,
and every running job whose links changed during a scheduling pass is re-rated once, when the pass ends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.sim.features.base import Feature
from gpufleet.sim.jobstate import RUNNING

if TYPE_CHECKING:
    import polars as pl

    from gpufleet.sim.network import NetworkState
    from gpufleet.sim.partition import Allocation


class NetworkFeature(Feature):
    """Speeds from link contention (``gpufleet.sim.network``) instead of the flat placement penalty."""

    name = "network"

    def __init__(self, state: NetworkState) -> None:
        self.state = state
        self.contention_gpu_s = 0.0
        self._dirty: dict[int, None] = {}  # running jobs whose links changed in this pass

    def start_speed(self, j: int, p: int, alloc: Allocation, speed: float) -> float:
        net = self.state
        self._dirty.update(dict.fromkeys(net.attach(j, p, alloc)))
        return net.rate(j)

    def on_stop(self, j: int, now: float) -> None:
        sim = self.sim
        net = self.state
        self.contention_gpu_s += net.lost(j) * (now - sim.pseg_start[j]) * sim.gpus[j]
        touched = net.detach(j)
        if touched:
            self._dirty.update(dict.fromkeys(touched))

    def end_pass(self, now: float) -> None:
        """Give every running job whose links changed in this pass its new speed (same instant: exact)."""
        dirty = self._dirty
        if not dirty:
            return
        sim = self.sim
        net = self.state
        state = sim.state
        for k in dirty:
            if state[k] != RUNNING:
                continue
            lost = net.lost(k)  # the loss up to now, before the new ratio applies
            new = net.rate(k)
            if new == sim.seg_speed[k]:
                continue
            self.contention_gpu_s += lost * (now - sim.pseg_start[k]) * sim.gpus[k]
            sim.change_speed(k, now, new)
        dirty.clear()

    def summary(self, jobs: pl.DataFrame, timeline: pl.DataFrame) -> dict[str, Any]:
        return self.state.summary(self.contention_gpu_s)
