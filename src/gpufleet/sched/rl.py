"""``rl`` as a policy name: alias of (non-preemptive ``srsf`` order, ``rl`` placement).

The learned placement itself, and the model loading, live in :mod:`gpufleet.sched.placement.rl`; the names
are re-exported here.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gpufleet.sched.netaware import CandidatePolicy
from gpufleet.sched.placement.rl import (
    DEFAULT_MODEL,
    Decider,
    RLPlacement,
    default_model_path,
    load_model,
    require_rl,
)
from gpufleet.sched.policy import register

__all__ = [
    "DEFAULT_MODEL",
    "Decider",
    "LearnedPlacement",
    "RLPlacement",
    "default_model_path",
    "load_model",
    "require_rl",
]


@register
class LearnedPlacement(CandidatePolicy):
    """Alias of (non-preemptive ``order``, ``rl`` placement); ``decider`` replaces the model (training)."""

    name = "rl"
    summary = "alias of the rl placement (PPO, gpufleet sched train-rl) under non-preemptive SRSF order"
    default_placement = "rl"
    #: ``order`` srsf (GPUs x remaining time): the order the shipped model was trained and selected in
    #: (docs/contention.md); a model trained in another order should be run with that order.
    #: ``guard`` 0: the alias keeps the unguarded policy it was trained and judged with on the t = 0 mixes.
    options: ClassVar[dict[str, float | str]] = {"order": "srsf", **RLPlacement.options, "guard": 0.0}

    def __init__(self, decider: Decider | None = None, **opts: Any) -> None:
        self._decider = decider
        super().__init__(**opts)

    def _make_placer(self, opts: dict[str, Any]) -> Any:
        return RLPlacement(decider=self._decider, **opts)

    @property
    def decisions(self) -> int:
        return self.placer.decisions

    @property
    def fallbacks(self) -> int:
        return self.placer.fallbacks

    @property
    def delegated(self) -> int:
        return self.placer.delegated

    @property
    def waits(self) -> int:
        return self.placer.waits
