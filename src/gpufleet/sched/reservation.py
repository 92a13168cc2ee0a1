"""EASY-style node reservation for a starving job: later jobs may use its nodes only if they finish in time.

A policy that keeps a large job waiting for a consolidated placement lets smaller jobs fill every node that
frees up, and the large job can wait until the cluster drains (the tail of the JCT distribution). EASY
backfilling (Lifka 1995; Mu'alem & Feitelson 2001) bounds that wait: the first job that cannot start gets a
reservation on the resources that free up earliest, and other jobs may start there only if they end before
the reservation begins. Here the reservation goes to a job once its wait reaches ``starve`` times its own
length, one job at a time (the longest-waiting), on whole nodes of its partition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reservation:
    """Nodes of partition ``part`` held for job ``job`` from time ``start`` on."""

    job: int
    part: int
    nodes: frozenset[int]
    start: float


def node_free_times(sim: Any, p: int, need: int) -> list[float]:
    """Per node of partition ``p``: when it is expected to have ``need`` GPUs free (its jobs end as predicted)."""
    part = sim.parts[p]
    ends: list[list[tuple[float, int]]] = [[] for _ in range(part.nodes)]
    for k in sim.running_jobs():
        if sim.part_of[k] != p:
            continue
        for node, count in sim.alloc[k]:
            ends[node].append((sim.expected_finish[k], count))
    times = []
    for node in range(part.nodes):
        free = part.free[node]
        t = sim.now
        for end, count in sorted(ends[node]):
            if free >= need:
                break
            free += count
            t = end
        times.append(t if free >= need else math.inf)
    return times


def reserve(sim: Any, j: int, p: int) -> Reservation | None:
    """The reservation for job ``j`` on partition ``p``: the nodes that can hold it soonest, or None."""
    part = sim.parts[p]
    g, gpn = sim.gpus[j], part.gpus_per_node
    k = -(-g // gpn)
    times = node_free_times(sim, p, min(g, gpn))
    order = sorted(range(part.nodes), key=lambda n: (times[n], n))[:k]
    if len(order) < k or math.isinf(times[order[-1]]):
        return None
    return Reservation(j, p, frozenset(order), max(times[n] for n in order))


def starving(sim: Any, j: int, factor: float) -> bool:
    """Whether job ``j`` has waited at least ``factor`` times its remaining length."""
    return factor > 0 and sim.now - sim.submit[j] >= factor * sim.remaining[j]


def respects(res: Reservation, sim: Any, j: int, p: int, cand: list[tuple[int, int]], speed: float) -> bool:
    """Whether starting job ``j`` on ``cand`` now leaves the reservation intact: it avoids the reserved nodes,
    or it is expected to end before the reservation starts (backfilling)."""
    if j == res.job or p != res.part or not any(node in res.nodes for node, _ in cand):
        return True
    return sim.now + sim.remaining[j] / max(speed, 1e-3) <= res.start
