"""Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19), with its starvation guard.

Jobs sit in K priority queues by attained service in GPU-seconds (GPUs x time, the "2D" of 2D-LAS): a job
starts in queue 0 and is demoted when its attained service crosses the queue's threshold. Within a queue
jobs run in arrival order; a higher queue preempts a lower one. The starvation guard (the paper's
PromoteKnob) moves a job back to queue 0 once it has waited longer than ``promote_knob`` times the time it
has run, and restarts its service count there. Demotions and promotions are timers, so the policy costs
nothing between events.
"""

from __future__ import annotations

import itertools
from typing import ClassVar

from gpufleet.errors import ConfigError
from gpufleet.sched.policy import Policy, register

_DEMOTE, _PROMOTE = 0, 1
_QUEUE_SPAN = 1e12  # queue index weight in the key: larger than any submit time in seconds


def _parse_thresholds(value: object) -> list[float]:
    if isinstance(value, (int, float)):
        return [float(value)]
    try:
        out = [float(x) for x in str(value).replace(";", ",").split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"tiresias.thresholds must be comma-separated GPU-seconds, got '{value}'") from exc
    if any(b <= a for a, b in itertools.pairwise(out)) or any(x <= 0 for x in out):
        raise ConfigError(f"tiresias.thresholds must be positive and increasing, got '{value}'")
    return out


@register
class Tiresias(Policy):
    """2D-LAS with discretised priority queues and the PromoteKnob starvation guard."""

    name = "tiresias"
    summary = "Tiresias 2D-LAS: GPU-time priority queues, FIFO within a queue, starvation guard"
    preemptive = True
    static_running_key = True
    ranks_by_service = True
    bound_never_grows = True  # the queue only changes through rekey_running (a demotion)
    # queue thresholds in GPU-seconds (K-1 values for K queues) and the starvation knob
    options: ClassVar[dict[str, float | str]] = {"thresholds": "3600,36000", "promote_knob": 8.0}

    def __init__(self, **opts: object) -> None:
        super().__init__(**opts)
        self.thresholds = _parse_thresholds(self.opts["thresholds"])
        self.knob = float(self.opts["promote_knob"])
        if self.knob < 0:
            raise ConfigError("tiresias.promote_knob must be >= 0 (0 disables the starvation guard)")

    def bind(self, sim: object) -> None:
        super().bind(sim)  # type: ignore[arg-type]
        n = sim.n  # type: ignore[attr-defined]
        self.queue = [0] * n
        self.base = [0.0] * n  # attained service when the job last entered queue 0
        self.promotions = 0

    def waiting_key(self, j: int, now: float) -> float:
        return self.queue[j] * _QUEUE_SPAN + self.sim.submit[j]

    def _arm_demotion(self, j: int, now: float) -> None:
        q = self.queue[j]
        if q >= len(self.thresholds):
            return
        sim = self.sim
        used = sim.attained_now(j, now) - self.base[j]
        left = self.thresholds[q] - used
        sim.add_timer(now + max(left, 0.0) / sim.gpus[j], j, _DEMOTE)

    def on_start(self, j: int, now: float) -> None:
        self._arm_demotion(j, now)

    def on_preempt(self, j: int, now: float) -> None:
        # starvation guard: waiting longer than knob x the time the job has run promotes it to queue 0.
        # A job below queue 0 has run at least thresholds[0] / gpus seconds, so the wait is never zero.
        sim = self.sim
        if self.queue[j] > 0 and self.knob > 0:
            sim.add_timer(now + self.knob * sim.held_s[j], j, _PROMOTE)

    def on_timer(self, j: int, tag: int, now: float) -> None:
        sim = self.sim
        if tag == _DEMOTE:
            self.queue[j] += 1
            sim.rekey_running(j)
            self._arm_demotion(j, now)
        else:
            self.queue[j] = 0
            self.base[j] = sim.attained[j]
            self.promotions += 1
            sim.rekey_waiting(j)
