"""Network-aware placement policies: each chooses among the candidate node sets of
:mod:`gpufleet.sched.candidates`, in the same code path, so that they differ only in the choice.

- ``contention``: the hand-written heuristic. Consolidate when a node fits; otherwise the candidate that
  costs least GPU-throughput, counting the job's own slowdown (placement and contention) and the speed it
  takes from the jobs whose links it would share: which pairs communication-heavy jobs with light ones.
- ``random``: a uniformly random feasible candidate (the ablation every table shows).
- ``las-spread`` / ``srtf-spread``: LAS and SRTF with the paper's spread-first placement, kept only to show
  that the published comparison is reproduced (its baselines spread every job over up to 4 nodes).

Jobs are taken in ``order`` (``srtf``: least remaining time; ``srsf``: least remaining service, GPUs x remaining
time, Tiresias' 2D "shortest remaining service first"; ``las``: least attained service; ``fifo``);
``contention``, ``random`` and ``rl`` do not preempt; the spread variants preempt as LAS and SRTF do.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.sched.candidates import candidate_placements, spread_placement
from gpufleet.sched.las import LeastAttainedService
from gpufleet.sched.policy import Policy, register
from gpufleet.sched.srtf import ShortestRemainingTimeFirst

ORDERS = ("srtf", "srsf", "las", "fifo")


class CandidatePolicy(Policy):
    """Base of policies that order jobs by ``order`` and pick one of the candidate placements."""

    options: ClassVar[dict[str, float | str]] = {"order": "srtf"}
    needs: ClassVar[frozenset[str]] = frozenset({"network"})

    def __init__(self, **opts: Any) -> None:
        super().__init__(**opts)
        if self.opts["order"] not in ORDERS:
            raise ConfigError(f"{self.name}.order must be one of {', '.join(ORDERS)}, got '{self.opts['order']}'")
        self._order = str(self.opts["order"])

    def waiting_key(self, j: int, now: float) -> float:
        sim = self.sim
        if self._order == "srtf":
            return sim.remaining[j]
        if self._order == "srsf":
            return sim.remaining[j] * sim.gpus[j]
        if self._order == "las":
            return sim.attained[j]
        return sim.submit[j]

    def place(self, j: int, p: int, part: Any) -> list[tuple[int, int]] | None:
        sim = self.sim
        cands = candidate_placements(part, sim.gpus[j], sim.network, p)
        if not any(c is not None for c in cands):
            return None
        idx = self.choose(j, p, part, cands)
        if idx is None or cands[idx] is None:
            return None
        return part.take(cands[idx])

    def choose(self, j: int, p: int, part: Any, cands: list) -> int | None:
        """Index of the chosen candidate (None: the job waits)."""
        raise NotImplementedError

    def scores(self, j: int, p: int, cands: list) -> list[tuple[float, float, float] | None]:
        """Per candidate: (job speed, contention ratio, speed taken from others) if it started there now."""
        sim = self.sim
        net = sim.network
        out: list[tuple[float, float, float] | None] = []
        g = sim.gpus[j]
        fewest = sim.parts[p].ideal_nodes(g)
        penalty = sim.config.placement_penalty
        for c in cands:
            if c is None:
                out.append(None)
            elif net is not None:
                out.append(net.predict(j, p, c))
            else:
                out.append((1.0 if len(c) <= fewest else 1.0 - penalty, 1.0, 0.0))
        return out


def least_cost(scores: list, gpus: int) -> tuple[int | None, float]:
    """The candidate that loses least GPU-throughput (own slowdown plus speed taken from others), and its speed.

    Ties go to the earlier slot, i.e. to fewer nodes and best fit."""
    best, best_cost, best_speed = None, np.inf, 0.0
    for i, sc in enumerate(scores):
        if sc is None:
            continue
        speed, _, harm = sc
        cost = gpus * (1.0 - speed) + harm
        if cost < best_cost - 1e-12:
            best, best_cost, best_speed = i, cost, speed
    return best, best_speed


@register
class ContentionHeuristic(CandidatePolicy):
    """Consolidate, else the node set with the least competing traffic; never idles GPUs by default."""

    name = "contention"
    summary = "network-aware: consolidate, else the node set whose links carry the least competing traffic"
    options: ClassVar[dict[str, float | str]] = {"order": "srtf", "wait_below": 0.0}

    def choose(self, j: int, p: int, part: Any, cands: list) -> int | None:
        best, speed = least_cost(self.scores(j, p, cands), self.sim.gpus[j])
        if best is not None and speed < float(self.opts["wait_below"]) and self.sim.n_running > 0:
            return None  # wait for a faster placement; only while something runs, so that an event will come
        return best


@register
class RandomPlacement(CandidatePolicy):
    """A uniformly random feasible candidate: what placement gains without any knowledge."""

    name = "random"
    summary = "ablation: a uniformly random feasible candidate node set (same order and code path as rl)"
    options: ClassVar[dict[str, float | str]] = {"order": "srtf", "seed": 0.0}

    def bind(self, sim: Any) -> None:
        super().bind(sim)
        self._rng = np.random.default_rng(int(self.opts["seed"]))

    def choose(self, j: int, p: int, part: Any, cands: list) -> int | None:
        valid = [i for i, c in enumerate(cands) if c is not None]
        return int(valid[self._rng.integers(len(valid))])


class _Spread:
    """Mixin: the paper's spread-first placement."""

    def place(self, j: int, p: int, part: Any) -> list[tuple[int, int]] | None:
        alloc = spread_placement(part, self.sim.gpus[j])  # type: ignore[attr-defined]
        return None if alloc is None else part.take(alloc)


@register
class LasSpread(_Spread, LeastAttainedService):
    """LAS with the paper's baseline placement (spread over up to 4 nodes, never one)."""

    name = "las-spread"
    summary = "LAS with spread-first placement, as in the DeepShare paper's baseline (for comparison only)"


@register
class SrtfSpread(_Spread, ShortestRemainingTimeFirst):
    """SRTF with the paper's baseline placement (spread over up to 4 nodes, never one)."""

    name = "srtf-spread"
    summary = "SRTF with spread-first placement, as in the DeepShare paper's baseline (for comparison only)"
