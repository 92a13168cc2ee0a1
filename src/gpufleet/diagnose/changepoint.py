"""Split one series into constant-level pieces: PELT with an l2 cost (ruptures), a BIC-like penalty, spike-proof.

Used by straggler detection on a rank's log(duration / fleet reference) series, so that "worker 6 got 1.4x
slower at step 1811 and recovered at step 1951" comes out as three segments. Kept generic: any 1-D float series.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from gpufleet.errors import DiagnoseError

#: Smallest noise scale used for the penalty, so that a noise-free series still gets a positive penalty.
_SIGMA_FLOOR = 1e-4


@dataclass(frozen=True)
class Segment:
    """A piece ``x[start:end]`` of a series (``end`` exclusive) and its level, the median of the raw values."""

    start: int
    end: int
    level: float


def robust_sigma(x: np.ndarray, block: int = 1) -> float:
    """Long-run noise scale of ``x``: from the MAD of differences of consecutive block means, times sqrt(block).

    Differences cancel level shifts and the MAD ignores spikes. With ``block`` > 1 it also counts the noise that
    neighbours share - timings sampled-and-held (each value logged twice) or slowly drifting - which would
    otherwise let PELT cut on noise: the variance of a mean of n such values is sigma^2 / n for this sigma.
    """
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    block = max(1, min(int(block), x.size // 4)) if x.size >= 8 else 1
    nb = x.size // block
    if nb < 3:
        return _SIGMA_FLOOR
    means = x[: nb * block].reshape(nb, block).mean(axis=1)
    d = np.diff(means)
    mad = float(np.median(np.abs(d - np.median(d))))
    return max(1.4826 * mad / math.sqrt(2.0) * math.sqrt(block), _SIGMA_FLOOR)


def bic_penalty(x: np.ndarray, scale: float = 3.0, block: int = 5) -> float:
    """PELT penalty ``scale * sigma^2 * log(n)`` with the long-run sigma of :func:`robust_sigma`; BIC is scale 2."""
    n = max(int(np.size(x)), 2)
    return scale * robust_sigma(x, block) ** 2 * math.log(n)


def segment_levels(
    x: np.ndarray,
    *,
    min_size: int = 5,
    penalty: float | None = None,
    penalty_scale: float = 3.0,
    smooth: int = 5,
    min_change: float = 0.05,
    max_points: int = 4000,
) -> list[Segment]:
    """Segments of constant level covering ``x`` (finite values only), in order.

    ``x`` is median-filtered (width ``smooth``, which keeps step edges and removes short spikes), then cut by
    PELT with an l2 cost (ruptures ``KernelCPD(kernel="linear")``, the C implementation). ``penalty`` defaults to
    :func:`bic_penalty` of the unfiltered series (of its block medians when it is blocked, see below).
    Series longer than ``max_points`` are cut on block medians. Each boundary is then moved, within
    ``max(min_size, block)`` points, to the best l2 split of the filtered series at full resolution. Neighbouring
    segments whose levels differ by less than ``min_change`` (in the units of ``x``; for a log series 0.05 is
    about 5%) are merged.
    """
    x = np.asarray(x, dtype=float)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise ValueError("segment_levels wants a 1-D series of finite values")
    n = x.size
    if n == 0:
        return []
    min_size = max(int(min_size), 1)
    block = max(1, math.ceil(n / max_points))
    smooth_x = _median_filter(x, smooth)
    work = _block_medians(x, block) if block > 1 else x
    size = max(1, math.ceil(min_size / block))
    pen = bic_penalty(work, penalty_scale, max(2, size)) if penalty is None else float(penalty)
    cuts = _pelt_cuts(_median_filter(work, smooth) if block > 1 else smooth_x, size, pen)
    bounds = _refine(smooth_x, [0, *(min(c * block, n) for c in cuts), n], max(min_size, block))
    segments = [Segment(a, b, float(np.median(x[a:b]))) for a, b in itertools.pairwise(bounds) if b > a]
    return _merge_close(x, segments, min_change)


def _block_medians(x: np.ndarray, block: int) -> np.ndarray:
    """Medians of consecutive blocks of ``block`` values (the last block may be shorter)."""
    nb = math.ceil(x.size / block)
    padded = np.full(nb * block, np.nan)
    padded[: x.size] = x
    return np.nanmedian(padded.reshape(nb, block), axis=1)


def _median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Centred running median with edge values repeated; width < 3 returns ``x`` unchanged."""
    if width < 3 or x.size < width:
        return x
    from scipy.ndimage import median_filter

    return median_filter(x, size=width, mode="nearest")


def _refine(y: np.ndarray, bounds: list[int], radius: int) -> list[int]:
    """Move each interior boundary, within ``radius``, to the best l2 split of its two neighbouring segments.

    PELT's minimum segment size (and blocking) can put a boundary a few points off a short episode's real edge;
    this puts it back, at full resolution and without a minimum size.
    """
    out = list(bounds)
    if len(out) <= 2:
        return out
    c1 = np.concatenate([[0.0], np.cumsum(y)])
    c2 = np.concatenate([[0.0], np.cumsum(y * y)])

    def sse(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        s = c1[b] - c1[a]
        return (c2[b] - c2[a]) - s * s / np.maximum(np.asarray(b) - np.asarray(a), 1)

    for i in range(1, len(out) - 1):
        a, b, c = out[i - 1], out[i], out[i + 1]
        ts = np.arange(max(a + 1, b - radius), min(c - 1, b + radius) + 1)
        if ts.size:
            out[i] = int(ts[np.argmin(sse(a, ts) + sse(ts, c))])
    return out


def _pelt_cuts(x: np.ndarray, min_size: int, pen: float) -> list[int]:
    """Interior change-point indices of ``x`` from ruptures' PELT (l2 cost); none when ``x`` is too short."""
    if x.size < 2 * min_size or pen <= 0 or float(np.ptp(x)) == 0.0:
        return []
    try:
        import ruptures as rpt
    except ImportError as exc:  # pragma: no cover - ruptures is a declared dependency
        raise DiagnoseError(
            "change-point detection needs the 'ruptures' package; install it with: pip install ruptures==1.1.10"
        ) from exc
    algo = rpt.KernelCPD(kernel="linear", min_size=min_size, jump=1).fit(x.reshape(-1, 1))
    try:
        bkps = algo.predict(pen=pen)
    except rpt.exceptions.BadSegmentationParameters:
        return []
    return [int(b) for b in bkps[:-1]]


def _merge_close(x: np.ndarray, segments: list[Segment], min_change: float) -> list[Segment]:
    """Merge the closest pair of neighbours until every neighbour differs in level by at least ``min_change``."""
    segs = list(segments)
    while len(segs) > 1:
        gaps = [abs(b.level - a.level) for a, b in itertools.pairwise(segs)]
        i = int(np.argmin(gaps))
        if gaps[i] >= min_change:
            break
        a, b = segs[i], segs[i + 1]
        segs[i : i + 2] = [Segment(a.start, b.end, float(np.median(x[a.start : b.end])))]
    return segs
