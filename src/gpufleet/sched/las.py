"""Least attained service: the job that has received the least GPU-time runs first.

Attained service grows while a job runs, so a running job loses its place to a waiting one once it has
received ``quantum_gpu_s`` GPU-seconds more than it. The quantum is what keeps LAS from degenerating into
processor sharing with a preemption every instant; the policy asks for a wakeup at the next such crossing.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.sched.policy import Policy, register


@register
class LeastAttainedService(Policy):
    """Preemptive LAS over GPU-time (the one-queue, continuous form of Tiresias' 2D-LAS)."""

    name = "las"
    summary = "least attained GPU-service first; preempts a job once it leads a waiting one by a quantum"
    preemptive = True
    scan_running = True
    ranks_by_service = True
    options: ClassVar[dict[str, float | str]] = {"quantum_gpu_s": 3600.0}

    def waiting_key(self, j: int, now: float) -> float:
        return self.sim.attained[j]

    def running_key(self, j: int, now: float) -> float:
        return self.sim.attained_now(j, now) - float(self.opts["quantum_gpu_s"])

    def should_preempt(self, victim_key: float, waiting_key: float) -> bool:
        return victim_key >= waiting_key - 1e-9

    def bind(self, sim: object) -> None:
        super().bind(sim)  # type: ignore[arg-type]
        n = sim.n  # type: ignore[attr-defined]
        # crossing base per running job: it leads a waiting job of key b by the quantum at base + b / gpus
        self._base = np.full(n, np.inf)
        self._offset = np.zeros(n)
        self._quantum = float(self.opts["quantum_gpu_s"])
        self._gpus = np.asarray(sim.workload.gpus, dtype=np.float64)  # type: ignore[attr-defined]

    def on_start(self, j: int, now: float) -> None:
        sim = self.sim
        g = sim.gpus[j]
        self._base[j] = now + (self._quantum - sim.attained[j]) / g
        self._offset[j] = sim.attained[j] - now * g

    def running_keys(self, jobs: np.ndarray, now: float) -> np.ndarray:
        # attained(now) = attained at start + (now - start) * gpus = offset + now * gpus
        return self._offset[jobs] + now * self._gpus[jobs] - self._quantum

    def next_wakeup(self, now: float) -> float | None:
        """The next time a running job's lead over the best waiting job reaches the quantum (vectorised)."""
        sim = self.sim
        best = sim.best_waiting_key()
        if best is None:
            return None
        running = sim.running_jobs()
        if not running:
            return None
        idx = np.fromiter(running, dtype=np.int64, count=len(running))
        when = self._base[idx] + best / self._gpus[idx]
        when = when[when > now + 1e-9]
        return float(when.min()) if when.size else None
