"""Shared base of the placements that choose among :mod:`gpufleet.sched.candidates`' node sets
(``contention``, ``random``, ``rl``), in one code path so that they differ only in the choice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpufleet.sched.candidates import candidate_placements
from gpufleet.sched.placement.base import Placement

if TYPE_CHECKING:
    from gpufleet.sched.view import Allocation, PartitionView


class CandidatePlacement(Placement):
    """Builds the candidate node sets and takes the one :meth:`choose` picks (None from it: the job waits)."""

    def place(self, j: int, p: int, part: PartitionView) -> Allocation | None:
        sim = self.sim
        self.waited = False
        cands = candidate_placements(part, sim.gpus[j], sim.network, p, sim.worker_gpus(j))
        if not any(c is not None for c in cands):
            return None
        idx = self.choose(j, p, part, cands)
        if idx is None or cands[idx] is None:
            self.waited = True
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
