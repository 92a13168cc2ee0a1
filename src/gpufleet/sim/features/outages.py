"""Node failures and predictor drains as an engine feature (the plan comes from ``gpufleet.sim.failures``).

A failure kills the jobs on its node: they roll back to their last checkpoint, go back to the queue and pay
``restart_s`` when they resume. A drain checkpoints them first (``checkpoint_save_s`` more on their next
start). Either way the node holds all its GPUs while it is down, so nothing starts there.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpufleet.sim.failures import DRAIN_DOWN, FAIL_DOWN, NODE_UP
from gpufleet.sim.features.base import Feature

if TYPE_CHECKING:
    import polars as pl

    from gpufleet.sim.failures import OutagePlan


class OutageFeature(Feature):
    """Replays an :class:`~gpufleet.sim.failures.OutagePlan`: a cursor into its event stream."""

    name = "outages"

    def __init__(self, plan: OutagePlan) -> None:
        self.plan = plan
        self._oi = 0
        self.job_interruptions = 0
        self.lost_failures_gpu_s = 0.0
        self.drain_moves = 0
        self.drain_cost_gpu_s = 0.0

    def bind(self, sim: Any) -> None:
        super().bind(sim)
        self.interruptions = [0] * sim.n  # kills by node failures, per job

    def next_time(self) -> float:
        times = self.plan.time
        return times[self._oi] if self._oi < len(times) else math.inf

    def apply(self, now: float) -> float:
        """Apply the outage events due by ``now``; returns the time of the next one (inf when none is left)."""
        sim = self.sim
        plan = self.plan
        i = self._oi
        times = plan.time
        while i < len(times) and times[i] <= now:
            kind = plan.kind[i]
            p = plan.part[i]
            node = plan.node[i]
            if kind in (FAIL_DOWN, DRAIN_DOWN):
                for j in sim.jobs_on_node(p, node):
                    self._interrupt(j, now, kind == FAIL_DOWN)
                sim.node_down(p, node)
            elif kind == NODE_UP:
                sim.node_up(p, node)
            i += 1
        self._oi = i
        return times[i] if i < len(times) else math.inf

    def _interrupt(self, j: int, now: float, lossy: bool) -> None:
        """A failure (``lossy``) rolls ``j`` back to its last checkpoint; a drain checkpoints it first."""
        sim = self.sim
        g = sim.gpus[j]
        restart = sim.config.restart_s
        if lossy:
            done, kept = sim.evict(j, now, lossy=True, before_requeue=self._count_kill)
            self.lost_failures_gpu_s += (done - kept + restart) * g
        else:
            save = self.plan.settings.checkpoint_save_s
            sim.add_restore(j, save)
            sim.evict(j, now, lossy=False)
            self.drain_moves += 1
            self.drain_cost_gpu_s += (save + restart) * g

    def _count_kill(self, j: int) -> None:
        self.interruptions[j] += 1
        self.job_interruptions += 1

    def job_columns(self) -> dict[str, Any]:
        return {"interruptions": self.interruptions}

    def summary(self, jobs: pl.DataFrame, timeline: pl.DataFrame) -> dict[str, Any]:
        """Failure and drain metrics of the run (see ``gpufleet.sim.failures``)."""
        out: dict[str, Any] = self.plan.summary(self._oi)
        out["job_interruptions"] = self.job_interruptions
        out["lost_gpu_hours_failures"] = self.lost_failures_gpu_s / 3600.0
        out["drain_moves"] = self.drain_moves
        out["drain_cost_gpu_hours"] = self.drain_cost_gpu_s / 3600.0
        return out
