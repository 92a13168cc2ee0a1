"""First-in first-out: jobs start in submit order, and a job that does not fit blocks those behind it."""

from __future__ import annotations

from gpufleet.sched.policy import Policy, register


@register
class Fifo(Policy):
    """Strict FIFO without backfilling, as in Tiresias' and Helios' baselines."""

    name = "fifo"
    summary = "first in, first out; the head of the queue blocks the rest (no backfill, no preemption)"
    blocking = True

    def waiting_key(self, j: int, now: float) -> float:
        return self.sim.submit[j]
