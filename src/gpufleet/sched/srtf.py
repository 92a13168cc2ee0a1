"""Shortest remaining time first with oracle durations: a shorter arrival preempts the longest-running-to-go job."""

from __future__ import annotations

from gpufleet.sched.policy import Policy, register


@register
class ShortestRemainingTimeFirst(Policy):
    """Preemptive SJF: the key is the remaining work, which only changes at starts, stops and completions."""

    name = "srtf"
    summary = "shortest remaining time first (oracle); preempts jobs with more work left"
    preemptive = True

    def waiting_key(self, j: int, now: float) -> float:
        return self.sim.remaining[j]

    def running_key(self, j: int, now: float) -> float:
        sim = self.sim
        return sim.remaining[j] - sim.progress_now(j, now)

    def running_order_key(self, j: int, now: float) -> float:
        # ordered like the remaining time: the expected completion time (fixed while the speed is; with --network
        # the simulator re-pushes a job whose speed changes)
        return self.sim.expected_finish[j]

    # A job slowed by its placement or by contention (speed <= 1) has more time than work left, so the remaining
    # time bounds the remaining work, and it is what the heap is ordered by: a slowed job at the top whose work
    # does not qualify must not end the search for one below it whose work does.
    bounded_running_key = True
    # the remaining time shrinks while a job runs; a slowdown that moves its finish later re-pushes it (change_speed)
    bound_never_grows = True

    def running_bound(self, j: int, now: float) -> float:
        return self.sim.expected_finish[j] - now
