"""Alpha-beta costs of the collectives training uses, vectorised over NumPy arrays.

Each function takes a message size ``size`` in bytes (the full buffer each rank holds), the group
size ``n``, a per-rank per-direction bandwidth ``bw`` in bytes/s and a per-step latency ``alpha`` in
seconds, and returns seconds. Ring algorithms (NCCL's default for large messages):

* all-reduce: ``2(n-1)/n · S/B + 2(n-1)·α``
* reduce-scatter, all-gather: ``(n-1)/n · S/B + (n-1)·α``

``hierarchical_*`` split a group of ``n`` ranks into ``g`` per node: intra-node reduce-scatter over
NVLink, inter-node collective on ``S/g`` over each GPU's NIC share, intra-node all-gather.
"""

from __future__ import annotations

import numpy as np

ArrayLike = np.ndarray | float | int

__all__ = [
    "all_gather",
    "hierarchical_all_gather",
    "hierarchical_all_reduce",
    "hierarchical_reduce_scatter",
    "p2p",
    "reduce_scatter",
    "ring_all_reduce",
]


def _steps(n: ArrayLike) -> np.ndarray:
    return np.maximum(np.asarray(n, dtype=float) - 1.0, 0.0)


def ring_all_reduce(size: ArrayLike, n: ArrayLike, bw: ArrayLike, alpha: ArrayLike = 0.0) -> np.ndarray:
    """Ring all-reduce time; zero for a group of one."""
    n = np.asarray(n, dtype=float)
    k = _steps(n)
    return 2.0 * k / np.maximum(n, 1.0) * np.asarray(size, dtype=float) / bw + 2.0 * k * alpha


def reduce_scatter(size: ArrayLike, n: ArrayLike, bw: ArrayLike, alpha: ArrayLike = 0.0) -> np.ndarray:
    """Ring reduce-scatter of a ``size``-byte buffer into ``n`` shards; zero for a group of one."""
    n = np.asarray(n, dtype=float)
    k = _steps(n)
    return k / np.maximum(n, 1.0) * np.asarray(size, dtype=float) / bw + k * alpha


def all_gather(size: ArrayLike, n: ArrayLike, bw: ArrayLike, alpha: ArrayLike = 0.0) -> np.ndarray:
    """Ring all-gather producing a ``size``-byte buffer on every rank (same cost as reduce-scatter)."""
    return reduce_scatter(size, n, bw, alpha)


def p2p(size: ArrayLike, bw: ArrayLike, alpha: ArrayLike = 0.0) -> np.ndarray:
    """One point-to-point send of ``size`` bytes."""
    return np.asarray(size, dtype=float) / bw + alpha


def _split(n: ArrayLike, per_node: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(n, dtype=float)
    g = np.clip(np.asarray(per_node, dtype=float), 1.0, np.maximum(n, 1.0))
    return g, np.maximum(n / g, 1.0)


def hierarchical_reduce_scatter(
    size: ArrayLike,
    n: ArrayLike,
    per_node: ArrayLike,
    intra_bw: ArrayLike,
    inter_bw: ArrayLike,
    intra_alpha: ArrayLike = 0.0,
    inter_alpha: ArrayLike = 0.0,
) -> np.ndarray:
    """Reduce-scatter over ``n`` ranks, ``per_node`` of them in each node: NVLink first, then NICs."""
    g, nodes = _split(n, per_node)
    return reduce_scatter(size, g, intra_bw, intra_alpha) + reduce_scatter(
        np.asarray(size, dtype=float) / g, nodes, inter_bw, inter_alpha
    )


def hierarchical_all_gather(
    size: ArrayLike,
    n: ArrayLike,
    per_node: ArrayLike,
    intra_bw: ArrayLike,
    inter_bw: ArrayLike,
    intra_alpha: ArrayLike = 0.0,
    inter_alpha: ArrayLike = 0.0,
) -> np.ndarray:
    """All-gather over ``n`` ranks: across nodes on ``S/g`` first, then inside each node."""
    return hierarchical_reduce_scatter(size, n, per_node, intra_bw, inter_bw, intra_alpha, inter_alpha)


def hierarchical_all_reduce(
    size: ArrayLike,
    n: ArrayLike,
    per_node: ArrayLike,
    intra_bw: ArrayLike,
    inter_bw: ArrayLike,
    intra_alpha: ArrayLike = 0.0,
    inter_alpha: ArrayLike = 0.0,
) -> np.ndarray:
    """All-reduce as intra-node reduce-scatter, inter-node all-reduce of ``S/g``, intra-node all-gather."""
    g, nodes = _split(n, per_node)
    intra = 2.0 * reduce_scatter(size, g, intra_bw, intra_alpha)
    return intra + ring_all_reduce(np.asarray(size, dtype=float) / g, nodes, inter_bw, inter_alpha)
