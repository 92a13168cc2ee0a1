"""Least attained service: the job that has received the least GPU-time runs first.

Attained service grows while a job runs, so a running job loses its place to a waiting one once it has
received ``quantum_gpu_s`` GPU-seconds more than it. The quantum is what keeps LAS from degenerating into
processor sharing with a preemption every instant; the policy asks for a wakeup at the next such crossing.
"""

from __future__ import annotations

from gpufleet.sched.base import Policy, register


@register
class LeastAttainedService(Policy):
    """Preemptive LAS over GPU-time (the one-queue, continuous form of Tiresias' 2D-LAS)."""

    name = "las"
    summary = "least attained GPU-service first; preempts a job once it leads a waiting one by a quantum"
    preemptive = True
    scan_running = True
    options = {"quantum_gpu_s": 3600.0}

    def waiting_key(self, j: int, now: float) -> float:
        return self.sim.attained[j]  # type: ignore[union-attr]

    def running_key(self, j: int, now: float) -> float:
        return self.sim.attained_now(j, now) - float(self.opts["quantum_gpu_s"])  # type: ignore[union-attr]

    def should_preempt(self, victim_key: float, waiting_key: float) -> bool:
        return victim_key >= waiting_key - 1e-9

    def next_wakeup(self, now: float) -> float | None:
        """The next time a running job's lead over the best waiting job reaches the quantum."""
        sim = self.sim
        best = sim.best_waiting_key()  # type: ignore[union-attr]
        if best is None:
            return None
        soonest = None
        for j in sim.running_jobs():  # type: ignore[union-attr]
            gap = best - self.running_key(j, now)
            if gap > 1e-9:
                t = now + gap / sim.gpus[j]  # type: ignore[union-attr]
                if soonest is None or t < soonest:
                    soonest = t
        return soonest
