"""Multiple-choice knapsack (MCKP): the solver behind phase 2 of the Aryl scheduler.

Aryl gives each elastic job a class whose items are "k extra workers" (weight: their GPUs, value: the JCT
reduction they buy) and picks exactly one item per class so that the leftover GPUs are not exceeded and the
summed value is largest. This module solves that problem as pure functions of arrays, independent of the
simulator:

- :func:`solve_mckp` is exact: a dynamic programme over capacity, O(sum K_i x C) time, vectorised across the
  capacity axis, with a compact choice table for the reconstruction.
- :func:`greedy_mckp` is the classical LP-relaxation greedy (upgrade along each class's upper convex hull by
  marginal value per GPU), for instances where the DP table would be too large.
- :func:`solve` picks one of the two by the size of the DP table.

Every solver returns ``(value, choice)`` where ``choice[i]`` is the index of the item taken from class ``i``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

__all__ = ["greedy_mckp", "solve", "solve_mckp"]

Classes = tuple[list[np.ndarray], list[np.ndarray]]


def _validate(values: Sequence[np.ndarray], weights: Sequence[np.ndarray], capacity: int) -> Classes:
    """Check the instance and return it as float64 values and int64 weights, one array per class.

    Raises ValueError for mismatched shapes, empty classes, negative or fractional weights, non-finite
    values, a negative capacity, and for an infeasible instance (the lightest items of all classes together
    exceed the capacity), naming the class at fault.
    """
    if int(capacity) != capacity or capacity < 0:
        raise ValueError(f"capacity must be a non-negative integer, got {capacity!r}")
    if len(values) != len(weights):
        raise ValueError(f"values has {len(values)} classes but weights has {len(weights)}")
    vals: list[np.ndarray] = []
    wts: list[np.ndarray] = []
    for i, (v, w) in enumerate(zip(values, weights, strict=True)):
        v_arr = np.asarray(v, dtype=np.float64).reshape(-1)
        w_raw = np.asarray(w).reshape(-1)
        if v_arr.size == 0:
            raise ValueError(f"class {i} has no items; every class needs at least one (e.g. 'no extra workers')")
        if v_arr.shape != w_raw.shape:
            raise ValueError(f"class {i}: {v_arr.size} values but {w_raw.size} weights")
        if not np.all(np.isfinite(v_arr)):
            raise ValueError(f"class {i}: values must be finite")
        w_arr = w_raw.astype(np.int64)
        if not np.array_equal(w_arr, w_raw) or np.any(w_arr < 0):
            raise ValueError(f"class {i}: weights must be non-negative integers, got {w_raw.tolist()}")
        vals.append(v_arr)
        wts.append(w_arr)
    lightest = [int(w.min()) for w in wts]
    total = sum(lightest)
    if total > capacity:
        heavy = [i for i, m in enumerate(lightest) if m > 0]
        raise ValueError(
            f"infeasible MCKP: classes {heavy[:10]}{'...' if len(heavy) > 10 else ''} have no item of weight 0 "
            f"and their lightest items weigh {total} in all, more than the capacity {capacity}; "
            "give every class a weight-0 item (e.g. 'no extra workers') or raise the capacity"
        )
    return vals, wts


def solve_mckp(
    values: Sequence[np.ndarray], weights: Sequence[np.ndarray], capacity: int, *, check: bool = True
) -> tuple[float, list[int]]:
    """Pick exactly one item per class maximising total value with total weight <= capacity.

    Class ``i`` has items ``k = 0..K_i-1`` with float ``values[i][k]`` (negative allowed) and non-negative
    integer ``weights[i][k]``. The instance must be feasible (e.g. every class has an item of weight 0),
    otherwise ValueError says which classes make it infeasible.

    The DP runs over the classes from last to first: ``g_i[c]`` is the best value of classes ``i..n-1``
    within ``c`` units of capacity, ``g_i[c] = max_k values[i][k] + g_{i+1}[c - weights[i][k]]``. Each class
    is one vectorised step over the whole capacity axis; a choice table (int16 where it fits) of shape
    ``classes x (capacity + 1)`` records the maximising item. Time O(sum K_i x C), memory O(n x C).

    Tie-breaking is deterministic: among solutions of equal value (compared exactly, as floats) the one whose
    item indices are lexicographically smallest wins, i.e. earlier classes get the smaller index first. With
    items ordered by number of extra workers, that prefers fewer extra workers for earlier classes. It follows
    from running the DP backwards, storing the *first* maximising item per cell, and reconstructing forwards.

    Returns ``(value, choice)``: the optimal value (summed exactly over the chosen items) and the chosen item
    index per class. ``check=False`` skips input validation, for callers that build valid float64 / int64
    arrays themselves (the simulator calls this thousands of times per run).
    """
    if check:
        vals, wts = _validate(values, weights, capacity)
    else:
        vals, wts = list(values), list(weights)
    n = len(vals)
    cap = int(capacity)
    if n == 0:
        return 0.0, []
    max_items = max(v.size for v in vals)
    choice = np.zeros((n, cap + 1), dtype=np.int16 if max_items <= np.iinfo(np.int16).max else np.int32)
    cols = np.arange(cap + 1)
    # [-inf x (cap + 1) | g]: reading g at c - w lands on -inf where the item does not fit (c < w); weights past
    # the capacity never fit and are read as cap + 1 (the choice table's reconstruction keeps the real ones)
    padded = np.full(2 * cap + 2, -np.inf)
    best = padded[cap + 1 :]
    best[:] = 0.0  # g_n: no classes left, value 0 at every capacity
    shift = cols + (cap + 1)
    dp_wts = wts if int(np.concatenate(wts).max()) <= cap + 1 else [np.minimum(w, cap + 1) for w in wts]
    for i in range(n - 1, -1, -1):
        # cand[k, c] = v[k] + best[c - w[k]] in one gather for all items
        cand = padded[shift - dp_wts[i][:, None]]
        cand += vals[i][:, None]
        first = cand.argmax(axis=0)  # argmax returns the first maximum: the smallest item index on ties
        best[:] = cand[first, cols]
        choice[i] = first
    picked: list[int] = []
    c = cap
    for i in range(n):
        k = int(choice[i, c])
        picked.append(k)
        c -= int(wts[i][k])
    return math.fsum(float(vals[i][k]) for i, k in enumerate(picked)), picked


def _hull(v: np.ndarray, w: np.ndarray, cap: int) -> list[int]:
    """The items of one class on its upper convex hull, from the lightest item up, in increasing weight.

    Items heavier than ``cap`` are ignored. Items dominated (another item weighs no more and is worth at
    least as much) are dropped; so are items strictly below the hull. Collinear items are kept, so that a
    step of equal marginal value can be taken one worker at a time.
    """
    order = sorted((i for i in range(v.size) if w[i] <= cap), key=lambda i: (w[i], -v[i], i))
    kept: list[int] = []
    for i in order:
        if kept and (w[i] == w[kept[-1]] or v[i] <= v[kept[-1]]):
            continue  # same weight but not better, or heavier and not better: dominated
        while len(kept) >= 2:
            a, b = kept[-2], kept[-1]
            # drop b if it lies strictly below the segment a -> i (cross product). Values are float sums, so
            # "strictly" allows a few ulps: cumsum can put a collinear item 1 ulp low, and dropping it would merge
            # two one-worker steps into one two-worker step that a greedy with one unit left cannot take
            lhs = (v[b] - v[a]) * (w[i] - w[a])
            rhs = (v[i] - v[a]) * (w[b] - w[a])
            if lhs < rhs - 1e-12 * max(abs(lhs), abs(rhs), 1.0):
                kept.pop()
            else:
                break
        kept.append(i)
    return kept


def _ratio(v: np.ndarray, w: np.ndarray, hull: list[int], s: int) -> float:
    """Minus the marginal value per unit weight of hull step ``s`` (a heap key: the best step is smallest)."""
    return -float(v[hull[s]] - v[hull[s - 1]]) / float(w[hull[s]] - w[hull[s - 1]])


def greedy_mckp(values: Sequence[np.ndarray], weights: Sequence[np.ndarray], capacity: int) -> tuple[float, list[int]]:
    """Approximate MCKP by upgrading classes in order of marginal value per unit weight (the LP greedy).

    Every class starts at its lightest item (the most valuable one among equally light items). Each class's
    upper convex hull gives a chain of upgrades with decreasing marginal value per unit of weight. The
    greedy repeatedly takes the best next upgrade over all classes (ties: the earlier class) if it fits; a
    class whose next upgrade does not fit is frozen, since its later upgrades presuppose that one, and the
    others go on. Hull upgrades always add value, so the greedy never buys weight for nothing.

    This is the integral part of the classical LP-relaxation solution of MCKP (Sinha & Zoltners), run to
    exhaustion. It is optimal when all upgrades of all hulls weigh the same (e.g. one worker of ``g`` GPUs)
    and values are concave in the item index; in general its value is at most the optimum. Time
    O(sum K_i log sum K_i), independent of the capacity.

    Same arguments, errors and return type as :func:`solve_mckp`.
    """
    vals, wts = _validate(values, weights, capacity)
    cap = int(capacity)
    hulls = [_hull(v, w, cap) for v, w in zip(vals, wts, strict=True)]
    current = [0] * len(hulls)  # position of each class on its hull
    left = cap - sum(int(wts[i][h[0]]) for i, h in enumerate(hulls))
    # one pending upgrade per class (its next hull step), so a class's steps are taken in order even if
    # rounding makes two collinear steps' ratios differ in the last bit
    pending = [(_ratio(vals[i], wts[i], h, 1), i) for i, h in enumerate(hulls) if len(h) > 1]
    heapq.heapify(pending)
    while pending and left > 0:
        _, i = heapq.heappop(pending)
        h, s = hulls[i], current[i] + 1
        dw = int(wts[i][h[s]] - wts[i][h[s - 1]])
        if dw > left:
            continue  # frozen: its later upgrades presuppose this one
        left -= dw
        current[i] = s
        if s + 1 < len(h):
            heapq.heappush(pending, (_ratio(vals[i], wts[i], h, s + 1), i))
    picked = [h[p] for h, p in zip(hulls, current, strict=True)]
    return math.fsum(float(vals[i][k]) for i, k in enumerate(picked)), picked


def solve(
    values: Sequence[np.ndarray],
    weights: Sequence[np.ndarray],
    capacity: int,
    max_cells: int = 5_000_000,
    *,
    check: bool = True,
) -> tuple[float, list[int]]:
    """Solve MCKP exactly with :func:`solve_mckp` when the DP is small enough, else with :func:`greedy_mckp`.

    The DP's work is ``sum(K_i) x capacity`` cells; at most ``max_cells`` of them (default 5 million, well
    under a second) it is used, above that the greedy is. Same return type as both.
    """
    cells = sum(int(np.size(v)) for v in values) * int(capacity)
    if cells <= max_cells:
        return solve_mckp(values, weights, capacity, check=check)
    return greedy_mckp(values, weights, capacity)
