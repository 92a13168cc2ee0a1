"""The network-aware policies of before the placement layer, kept as aliases of (order, placement) pairs.

- ``contention``: non-preemptive order ``order`` with the ``contention`` placement;
- ``random``: the same order with the ``random`` placement;
- ``rl`` (:mod:`gpufleet.sched.rl`): order ``srsf`` with the ``rl`` placement;
- ``las-spread`` / ``srtf-spread``: preemptive LAS / SRTF with the ``spread`` placement (the DeepShare paper's
  baselines, kept to show that the published comparison is reproduced).

Jobs are taken in ``order`` (``srtf``: least remaining time; ``srsf``: least remaining service, GPUs x remaining
time, Tiresias' 2D "shortest remaining service first"; ``las``: least attained service; ``fifo``), without
preemption. Any order now runs with any placement (``--policy srtf --placement contention``); these names give
the same results as before. Their placement's options (``wait_below``, ``seed``, ``model``, ``sample``) are
options of the alias.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gpufleet.errors import ConfigError
from gpufleet.sched.las import LeastAttainedService
from gpufleet.sched.placement.base import make_placement
from gpufleet.sched.placement.candidates import least_cost
from gpufleet.sched.placement.contention import ContentionPlacement
from gpufleet.sched.placement.random import RandomPlacement
from gpufleet.sched.policy import Policy, register
from gpufleet.sched.srtf import ShortestRemainingTimeFirst

ORDERS = ("srtf", "srsf", "las", "fifo")
__all__ = ["ORDERS", "CandidatePolicy", "least_cost"]


class CandidatePolicy(Policy):
    """An alias: a non-preemptive ``order`` with the placement ``default_placement``, whose options it takes."""

    options: ClassVar[dict[str, float | str]] = {"order": "srtf"}
    needs: ClassVar[frozenset[str]] = frozenset({"network"})

    def __init__(self, **opts: Any) -> None:
        super().__init__(**opts)
        if self.opts["order"] not in ORDERS:
            raise ConfigError(f"{self.name}.order must be one of {', '.join(ORDERS)}, got '{self.opts['order']}'")
        self._order = str(self.opts["order"])
        self.use_placement(self._make_placer({k: v for k, v in self.opts.items() if k != "order"}))

    def _make_placer(self, opts: dict[str, Any]) -> Any:
        return make_placement(self.default_placement, **opts)

    def waiting_key(self, j: int, now: float) -> float:
        sim = self.sim
        if self._order == "srtf":
            return sim.remaining[j]
        if self._order == "srsf":
            return sim.remaining[j] * sim.gpus[j]
        if self._order == "las":
            return sim.attained[j]
        return sim.submit[j]


@register
class ContentionHeuristic(CandidatePolicy):
    """Alias of (non-preemptive ``order``, ``contention`` placement); never idles GPUs by default."""

    name = "contention"
    summary = "alias of the contention placement under non-preemptive SRTF order (--placement contention)"
    default_placement = "contention"
    options: ClassVar[dict[str, float | str]] = {"order": "srtf", **ContentionPlacement.options}


@register
class RandomAlias(CandidatePolicy):
    """Alias of (non-preemptive ``order``, ``random`` placement)."""

    name = "random"
    summary = "alias of the random placement under non-preemptive SRTF order (--placement random)"
    default_placement = "random"
    options: ClassVar[dict[str, float | str]] = {"order": "srtf", **RandomPlacement.options}


@register
class LasSpread(LeastAttainedService):
    """Alias of (``las``, ``spread``): LAS with the paper's baseline placement."""

    name = "las-spread"
    summary = "alias of las with the spread placement, the DeepShare paper's baseline (for comparison only)"
    default_placement = "spread"


@register
class SrtfSpread(ShortestRemainingTimeFirst):
    """Alias of (``srtf``, ``spread``): SRTF with the paper's baseline placement."""

    name = "srtf-spread"
    summary = "alias of srtf with the spread placement, the DeepShare paper's baseline (for comparison only)"
    default_placement = "spread"
