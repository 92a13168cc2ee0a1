"""Downsampling of large result arrays before plotting, so reports stay small and fast to write.

Two shapes of data need it: samples whose distribution is plotted (a CDF evaluated at a few hundred
quantiles) and step functions over time (averaged per bucket, weighted by how long each value held).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["quantile_points", "time_weighted_resample"]


def quantile_points(values: ArrayLike, n: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, p)``: the empirical quantiles ``x`` of ``values`` at ``n`` probabilities ``p``.

    ``p`` runs evenly from 0 to 1, so ``(x, p)`` traces the empirical CDF with ``n`` points however many
    values there are. NaN and infinite values are ignored (unfinished jobs). Both arrays are
    non-decreasing; with no finite values both are empty.
    """
    if n < 2:
        raise ValueError(f"quantile_points needs n >= 2 points, got n={n}")
    arr = np.asarray(values, dtype=np.float64).ravel()
    arr = np.sort(arr[np.isfinite(arr)])
    if arr.size == 0:
        return np.empty(0), np.empty(0)
    p = np.linspace(0.0, 1.0, n)
    pos = p * (arr.size - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, arr.size - 1)
    frac = pos - lo
    x = arr[lo] + (arr[hi] - arr[lo]) * frac
    # Linear interpolation is monotone in exact arithmetic; guard against one-ulp rounding dips.
    return np.maximum.accumulate(x), p


def time_weighted_resample(
    time: ArrayLike,
    value: ArrayLike,
    n_buckets: int,
    end_time: float,
    start_time: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Average a step function over ``n_buckets`` equal time buckets; return ``(bucket_start, mean)``.

    ``value[i]`` holds from ``time[i]`` until the next event (the last one until ``end_time``); several
    events at one time mean the last one wins. Each bucket gets the mean of the function over the
    bucket, weighted by how long each value held, so the integral (e.g. GPU-seconds) is preserved
    exactly. ``start_time`` defaults to the first event; before the first event the value is 0.
    """
    if n_buckets < 1:
        raise ValueError(f"time_weighted_resample needs n_buckets >= 1, got {n_buckets}")
    t = np.asarray(time, dtype=np.float64).ravel()
    v = np.asarray(value, dtype=np.float64).ravel()
    if t.shape != v.shape:
        raise ValueError(f"time and value differ in length: {t.size} vs {v.size}")
    dt = np.diff(t)
    if np.any(dt < 0):
        order = np.argsort(t, kind="stable")  # stable: events at one time keep their order
        t, v = t[order], v[order]
        dt = np.diff(t)
    if start_time is None:
        start_time = float(t[0]) if t.size else 0.0
    if not end_time > start_time:
        raise ValueError(f"end_time ({end_time}) must be later than start_time ({start_time})")
    edges = np.linspace(start_time, end_time, n_buckets + 1)
    if t.size == 0:
        return edges[:-1], np.zeros(n_buckets)
    # cum[i] is the integral from t[0] to t[i]; F(x) = cum[i] + v[i] * (x - t[i]) with t[i] <= x.
    cum = np.concatenate(([0.0], np.cumsum(v[:-1] * dt)))
    idx = np.searchsorted(t, edges, side="right") - 1
    safe = np.maximum(idx, 0)
    integral = np.where(idx >= 0, cum[safe] + v[safe] * (edges - t[safe]), 0.0)
    return edges[:-1], np.diff(integral) / np.diff(edges)
