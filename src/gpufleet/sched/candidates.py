"""Candidate node sets for a job: a fixed, small menu of placements that scales to any cluster size.

Each slot is a shape (the job's GPUs split evenly over 1, 2 or 4 nodes, the spreads DeepShare measured on its
4-node testbed) and a way to pick the nodes:

- ``pack``: the nodes with the fewest free GPUs that still fit the share (best fit, keeps whole nodes free);
- ``net``: for one node, the node whose NIC carries the most traffic (a single-node job does not use the
  network, so it is best put where multi-node jobs already are); for several nodes, the nodes whose NICs
  carry the least competing traffic.

A last slot, ``any``, is the fewest-nodes placement with best fit that the baselines use, uneven splits
allowed. A slot is None when its shape does not fit now. Policies (the contention heuristic, random, the
learned policy) choose a slot; the menu is the same whether the cluster has 4 nodes or 4,000.
"""

from __future__ import annotations

from typing import Any

#: Node counts a job may be spread over (even split of its GPUs). No 8-node shape: a learned policy trained on
#: the 4-node testbed never saw one fit, so its choice there would be untrained; larger jobs still get the
#: fewest-nodes slot.
SHAPES = (1, 2, 4)
#: (nodes, strategy) per slot, then the uneven fewest-nodes fallback as (0, "any").
SLOTS: tuple[tuple[int, str], ...] = (*((n, s) for n in SHAPES for s in ("pack", "net")), (0, "any"))
N_SLOTS = len(SLOTS)

Allocation = list[tuple[int, int]]


def _eligible(part: Any, per: int) -> list[int]:
    """Nodes with at least ``per`` free GPUs, fewest free first (bucket order within a count)."""
    out: list[int] = []
    for k in range(per, part.gpus_per_node + 1):
        out.extend(part.buckets[k])
    return out


def candidate_placements(part: Any, gpus: int, net: Any = None, p: int = 0, unit: int = 1) -> list[Allocation | None]:
    """The allocation of every slot of :data:`SLOTS` for a job of ``gpus`` GPUs on ``part`` (None: no fit).

    ``net`` is the simulator's network model, a :class:`~gpufleet.sched.view.NetworkView` (None: no network
    model, and the ``net`` strategy falls back to best fit). ``unit``: a node's share must be a multiple of it
    (an elastic job's workers of ``unit`` GPUs each sit on one server). Nothing is taken from ``part``.
    """
    out: list[Allocation | None] = []
    free_total = part.total_free
    gpn = part.gpus_per_node
    cache: dict[int, list[int]] = {}
    for n, strategy in SLOTS:
        if n == 0:
            out.append(part._plan_consolidate(gpus) if gpus <= free_total else None)
            continue
        per, rest = divmod(gpus, n)
        if rest or per == 0 or per % unit or per > gpn or gpus > free_total or n > part.nodes:
            out.append(None)
            continue
        nodes = cache.get(per)
        if nodes is None:
            nodes = cache[per] = _eligible(part, per)
        if len(nodes) < n:
            out.append(None)
            continue
        if strategy == "pack" or net is None:
            chosen = nodes[:n]
        else:
            rank = {node: i for i, node in enumerate(nodes)}
            if n == 1:
                chosen = [min(nodes, key=lambda x: (-net.nic_load(p, x), rank[x]))]
            else:
                chosen = sorted(nodes, key=lambda x: (net.nic_load(p, x), rank[x]))[:n]
        out.append([(node, per) for node in chosen])
    return out


def spread_placement(part: Any, gpus: int, max_nodes: int = 4, unit: int = 1) -> Allocation | None:
    """The paper-style baseline placement: as many nodes as an even split allows (at most ``max_nodes``,
    never one node unless nothing else fits, shares in multiples of ``unit``), best fit within the shape;
    the uneven fallback last."""
    if gpus > part.total_free:
        return None
    gpn = part.gpus_per_node
    for n in sorted((s for s in SHAPES if 2 <= s <= max_nodes), reverse=True):
        per, rest = divmod(gpus, n)
        if rest or per == 0 or per % unit or per > gpn:
            continue
        nodes = _eligible(part, per)
        if len(nodes) >= n:
            return [(node, per) for node in nodes[:n]]
    return part._plan_consolidate(gpus)
