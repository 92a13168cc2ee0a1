"""Shortest job first with oracle durations: non-preemptive, smaller jobs backfill when the best does not fit."""

from __future__ import annotations

from gpufleet.sched.policy import Policy, register


@register
class ShortestJobFirst(Policy):
    """Orders waiting jobs by their (oracle) duration; running jobs are never preempted."""

    name = "sjf"
    summary = "shortest job first by oracle duration; non-preemptive, backfills jobs that fit"

    def waiting_key(self, j: int, now: float) -> float:
        return self.sim.duration[j]
