"""The scores of one section of per-step timings: NVRx-style windowed relative / individual scores, a robust z,
and change points (PELT) on the ranks that the scores or a quick screen point at.

Everything is columnar: one ranks x steps matrix per section and windowed medians with NumPy.
:func:`gpufleet.diagnose.stragglers.detect_stragglers` runs one :class:`SectionAnalysis` per section.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from gpufleet.diagnose.changepoint import segment_levels

__all__ = ["SectionAnalysis"]


class SectionAnalysis:
    """All scores of one section, computed on a ranks x steps matrix (NaN where a rank did not record a step)."""

    def __init__(
        self,
        section: str,
        sub: pl.DataFrame,
        threshold: float,
        window: int | None,
        min_slowdown: float,
        q: float,
        min_segment: int | None,
        penalty_scale: float,
        max_cp: int,
    ) -> None:
        self.section, self.threshold, self.min_slowdown = section, threshold, min_slowdown
        self.notes: list[str] = []
        self.rank_ids, self.steps, self.M = _pivot(sub)
        n_ranks, n_steps = self.M.shape
        self.window = int(window) if window else int(np.clip(round(n_steps / 20), 5, 100))
        self.window = max(1, min(self.window, n_steps))
        self.min_segment = int(min_segment) if min_segment else max(5, self.window // 2)
        if n_ranks < 2:
            self.notes.append(f"section {section!r}: one rank only; relative scores are all 1")
        self._window_scores()
        self._whole_run_scores()
        self._changepoints(q, penalty_scale, max_cp)
        self._rank_frame()

    # -- windows
    def _window_scores(self) -> None:
        """Windowed medians and the NVRx relative / individual scores and the robust z per window."""
        R, S = self.M.shape
        w = self.window
        nw = math.ceil(S / w)
        padded = np.full((R, nw * w), np.nan)
        padded[:, :S] = self.M
        blocks = padded.reshape(R, nw, w)
        counts = np.isfinite(blocks).sum(axis=2)
        med = _nanmedian(blocks, axis=2)
        med[counts < max(1, w // 2)] = np.nan  # a rank with too few steps in a window gets no score there
        self.wmed = med
        best = np.fmin.accumulate(np.where(np.isfinite(med), med, np.inf), axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.wrel = _nanmin0(med) / med
            self.wind = np.where(np.isfinite(med), best / med, np.nan)
            self.wz = _robust_z(med)
        self.wflag = np.isfinite(self.wrel) & (self.wrel < self.threshold)
        starts = np.arange(nw) * w
        self.wstart = self.steps[starts]
        self.wend = self.steps[np.minimum(starts + w, S) - 1]
        self.windows = pl.DataFrame(
            {
                "section": np.full(R * nw, self.section, dtype=object).astype(str),
                "window": np.tile(np.arange(nw), R),
                "start_step": np.tile(self.wstart, R),
                "end_step": np.tile(self.wend, R),
                "rank": np.repeat(self.rank_ids, nw),
                "n": counts.ravel().astype(np.int64),
                "median_s": med.ravel(),
                "relative_score": self.wrel.ravel(),
                "individual_score": self.wind.ravel(),
                "z": self.wz.ravel(),
                "flagged": self.wflag.ravel(),
            }
        ).filter(pl.col("n") > 0)

    # -- whole run
    def _whole_run_scores(self) -> None:
        """Whole-run median, relative score, individual score (best window / last scored window) and z."""
        self.n = np.isfinite(self.M).sum(axis=1)
        self.med = _nanmedian(self.M, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.rel = np.nanmin(self.med) / self.med
            self.z = _robust_z(self.med[:, None])[:, 0]
        finite = np.isfinite(self.wmed)
        last_idx = np.where(finite.any(axis=1), self.wmed.shape[1] - 1 - np.argmax(finite[:, ::-1], axis=1), 0)
        last = self.wmed[np.arange(len(last_idx)), last_idx]
        with np.errstate(invalid="ignore", divide="ignore"):
            self.ind = np.where(finite.any(axis=1), _nanmin_rows(self.wmed) / last, np.nan)
            self.worst = np.where(finite.any(axis=1), _nanmin_rows(self.wrel), np.nan)
        self.nflag = self.wflag.sum(axis=1)
        self.nwin = finite.sum(axis=1)

    # -- change points
    def _changepoints(self, q: float, penalty_scale: float, max_cp: int) -> None:
        """PELT on log(duration / per-step reference) for the ranks the scores or a quick screen point at."""
        R = self.M.shape[0]
        self.seg_rows: list[dict[str, Any]] = []
        self.cp: dict[int, dict[str, Any]] = {}
        self.capped: set[int] = set()
        if R < 2:
            self.segments = _segments_frame([])
            return
        present = np.isfinite(self.M)
        ref = _nanquantile_cols(self.M, q)
        ref[present.sum(axis=0) < math.ceil(0.5 * R)] = np.nan
        with np.errstate(invalid="ignore", divide="ignore"):
            L = np.log(self.M / ref[None, :])
        if not np.isfinite(L).any():
            self.notes.append(f"section {self.section!r}: ranks share too few steps for change points")
            self.segments = _segments_frame([])
            return
        screen, noise = _screen(L, max(3, self.min_segment // 2))
        flagged = (self.nflag > 0) | (self.rel < self.threshold)
        moving = screen >= np.maximum(math.log1p((self.min_slowdown - 1.0) / 2.0), 5.0 * noise)
        cand = np.nonzero(flagged | moving)[0]
        order = cand[np.lexsort((-screen[cand], np.nan_to_num(self.rel[cand], nan=1.0)))]
        chosen, self.capped = order[:max_cp], set(order[max_cp:].tolist())
        if self.capped:
            self.notes.append(
                f"section {self.section!r}: change points ran on {len(chosen)} of {len(cand)} candidate"
                " ranks (raise max_changepoint_ranks for the rest)"
            )
        fast = self._fast_set()
        span_cache: dict[tuple[int, int], float] = {}
        for r in chosen:
            self._segment_rank(int(r), L[r], fast, span_cache, penalty_scale)
        self.segments = _segments_frame(self.seg_rows)

    def _fast_set(self) -> np.ndarray:
        """Ranks that can be the fastest over some span: all when few, else the 32 fastest plus each window's."""
        R = self.M.shape[0]
        if R <= 64:
            return np.arange(R)
        top = np.argsort(np.nan_to_num(self.med, nan=np.inf))[:32]
        per_window = np.argmin(np.where(np.isfinite(self.wmed), self.wmed, np.inf), axis=0)
        return np.unique(np.concatenate([top, per_window]))

    def _segment_rank(
        self, r: int, lrow: np.ndarray, fast: np.ndarray, cache: dict[tuple[int, int], float], penalty_scale: float
    ) -> None:
        """Segments of one rank, each with its ratio, NVRx relative score over its span and slowdown vs its best."""
        cols = np.nonzero(np.isfinite(lrow))[0]
        if cols.size == 0:
            return
        segs = segment_levels(
            lrow[cols],
            min_size=self.min_segment,
            penalty_scale=penalty_scale,
            min_change=math.log1p((self.min_slowdown - 1.0) / 2.0),
        )
        base = min(s.level for s in segs)
        raw = [
            float(_nanmedian(self.M[r, int(cols[s.start]) : int(cols[s.end - 1]) + 1][None, :], axis=1)[0])
            for s in segs
        ]
        rows = []
        for s, own in zip(segs, raw, strict=True):
            a, b = int(cols[s.start]), int(cols[s.end - 1])
            if (a, b) not in cache:
                cache[(a, b)] = float(np.nanmin(_nanmedian(self.M[fast, a : b + 1], axis=1)))
            rel = min(cache[(a, b)] / own, 1.0) if own > 0 else float("nan")
            # slower than its own best both relative to the fleet and in raw time: a fleet-wide slowdown or a
            # shift of the reference (most fast ranks slowing together) alone does not count
            self_slow = min(math.exp(s.level - base), own / min(raw))
            rows.append(
                {
                    "section": self.section,
                    "rank": int(self.rank_ids[r]),
                    "start_step": int(self.steps[a]),
                    "end_step": int(self.steps[b]),
                    "n_steps": int(s.end - s.start),
                    "ratio": math.exp(s.level),
                    "relative_score": rel,
                    "self_slowdown": self_slow,
                    "slow": False,
                }
            )
        self.cp[r] = self._episodes(rows)
        self.seg_rows.extend(rows)

    def _episodes(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Mark slow episodes with hysteresis and summarise them for the rank.

        A segment is slow when its relative score < threshold or it is ``min_slowdown`` x its own best; an episode
        is a run of segments that are at least half that much slower (``1 + (min_slowdown - 1) / 2``) holding a
        slow one, so that a ramp counts from where it starts and a wobble on the way back does not end it. An
        episode must last ``min_segment`` recorded steps; shorter ones are blips and are not counted.
        """
        enter = [row["relative_score"] < self.threshold or row["self_slowdown"] >= self.min_slowdown for row in rows]
        half = 1.0 + (self.min_slowdown - 1.0) / 2.0
        stay = [e or row["self_slowdown"] >= half for e, row in zip(enter, rows, strict=True)]
        episodes: list[tuple[int, int]] = []
        i = 0
        while i < len(rows):
            if not stay[i]:
                i += 1
                continue
            j = i
            while j + 1 < len(rows) and stay[j + 1]:
                j += 1
            long_enough = sum(row["n_steps"] for row in rows[i : j + 1]) >= self.min_segment
            if any(enter[i : j + 1]) and long_enough:  # shorter runs are blips (a held spike), not stragglers
                episodes.append((i, j))
            i = j + 1
        if not episodes:
            return {"slow": False}
        for a, b in episodes:
            for k in range(a, b + 1):
                rows[k]["slow"] = True
        slow_idx = [k for a, b in episodes for k in range(a, b + 1)]
        lowest = min(rows[k]["relative_score"] for k in slow_idx)
        worst = next(k for k in slow_idx if rows[k]["relative_score"] <= lowest * 1.05)  # the first of near-ties
        last = episodes[-1][1]
        return {
            "slow": True,
            "first": rows[episodes[0][0]]["start_step"],
            "recovered": rows[last + 1]["start_step"] if last + 1 < len(rows) else None,
            "slowdown": 1.0 / rows[worst]["relative_score"],
            "worst_step": rows[worst]["start_step"],
            "self_slowdown": max(rows[k]["self_slowdown"] for k in slow_idx),
            "episodes": len(episodes),
        }

    # -- per-rank verdict
    def _rank_frame(self) -> None:
        """One row per rank: scores, verdict, when its slowdown began / ended, and a one-line reason."""
        cols: dict[str, list[Any]] = {
            k: []
            for k in (
                "is_straggler",
                "first_slow_step",
                "recovered_step",
                "episodes",
                "worst_step",
                "slowdown",
                "self_slowdown",
                "reason",
            )
        }
        for r in range(self.M.shape[0]):
            v = self._verdict(r)
            for k in cols:
                cols[k].append(v.get(k))
        self.ranks = pl.DataFrame(
            {
                "section": [self.section] * self.M.shape[0],
                "rank": self.rank_ids.astype(np.int64),
                "n_steps": self.n.astype(np.int64),
                "median_s": self.med,
                "relative_score": self.rel,
                "individual_score": self.ind,
                "z": self.z,
                "worst_window_score": self.worst,
                "windows_flagged": self.nflag.astype(np.int64),
                "n_windows": self.nwin.astype(np.int64),
                "is_straggler": pl.Series(cols["is_straggler"], dtype=pl.Boolean),
                "first_slow_step": pl.Series(cols["first_slow_step"], dtype=pl.Int64),
                "recovered_step": pl.Series(cols["recovered_step"], dtype=pl.Int64),
                "episodes": pl.Series(cols["episodes"], dtype=pl.Int64),
                "worst_step": pl.Series(cols["worst_step"], dtype=pl.Int64),
                "slowdown": pl.Series(cols["slowdown"], dtype=pl.Float64),
                "self_slowdown": pl.Series(cols["self_slowdown"], dtype=pl.Float64),
                "reason": pl.Series(cols["reason"], dtype=pl.Utf8),
            }
        )

    def _verdict(self, r: int) -> dict[str, Any]:
        """Straggler or not, from the whole-run score, the change-point episodes or (when capped) the windows."""
        rel, info = float(self.rel[r]), self.cp.get(r)
        whole = math.isfinite(rel) and rel < self.threshold
        first_step = int(self.steps[np.argmax(np.isfinite(self.M[r]))])
        prefix = f"relative score {rel:.2f} over the whole run; " if whole else ""
        if info is not None and info["slow"]:
            until = f"until step {info['recovered']}" if info["recovered"] is not None else "to the end"
            return {
                "is_straggler": True,
                "first_slow_step": info["first"],
                "recovered_step": info["recovered"],
                "episodes": info["episodes"],
                "worst_step": info["worst_step"],
                "slowdown": info["slowdown"],
                "self_slowdown": info["self_slowdown"],
                "reason": f"{prefix}slow from step {info['first']} {until} ({info['episodes']} episode(s)); worst from"
                f" step {info['worst_step']}: {info['slowdown']:.2f}x the fastest rank,"
                f" {info['self_slowdown']:.2f}x its own best",
            }
        if r in self.capped and self.nflag[r] > 0:
            k = int(np.argmax(self.wflag[r]))
            worst_k = int(np.nanargmin(np.where(np.isfinite(self.wrel[r]), self.wrel[r], np.inf)))
            return {
                "is_straggler": True,
                "first_slow_step": int(self.wstart[k]),
                "worst_step": int(self.wstart[worst_k]),
                "episodes": 1,
                "slowdown": 1.0 / float(self.worst[r]),
                "reason": f"{prefix}flagged in {self.nflag[r]}/{self.nwin[r]} windows (no change points: capped)",
            }
        if whole:
            return {
                "is_straggler": True,
                "first_slow_step": first_step,
                "worst_step": first_step,
                "episodes": 1,
                "slowdown": 1.0 / rel,
                "reason": f"{prefix}{1.0 / rel:.2f}x the fastest rank",
            }
        return {"is_straggler": False, "episodes": 0, "reason": ""}


def _pivot(sub: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranks, steps and the ranks x steps duration matrix (repeated rows of one rank and step are summed)."""
    rank_col, step_col = sub["rank"].to_numpy(), sub["step"].to_numpy()
    rank_ids = np.sort(sub["rank"].unique().to_numpy())
    steps = np.sort(sub["step"].unique().to_numpy())
    flat = np.searchsorted(rank_ids, rank_col) * steps.size + np.searchsorted(steps, step_col)
    size = rank_ids.size * steps.size
    total = np.bincount(flat, weights=sub["duration_s"].to_numpy(), minlength=size)
    seen = np.bincount(flat, minlength=size)
    M = np.where(seen > 0, total, np.nan).reshape(rank_ids.size, steps.size)
    return rank_ids, steps, M


def _nanmedian(a: np.ndarray, axis: int) -> np.ndarray:
    """``np.nanmedian`` without the all-NaN warning (all-NaN slices give NaN)."""
    if not np.isnan(a).any():
        return np.median(a, axis=axis)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(a, axis=axis)


def _nanmin0(a: np.ndarray) -> np.ndarray:
    """Column-wise minimum ignoring NaN; NaN for an all-NaN column."""
    finite = np.isfinite(a)
    out = np.where(finite, a, np.inf).min(axis=0)
    return np.where(finite.any(axis=0), out, np.nan)


def _nanmin_rows(a: np.ndarray) -> np.ndarray:
    """Row-wise minimum ignoring NaN; NaN for an all-NaN row."""
    return _nanmin0(a.T)


def _robust_z(a: np.ndarray) -> np.ndarray:
    """(x - median) / (1.4826 MAD) down each column, the scale floored at 1% of |median| (no blow-up on ties)."""
    centre = _nanmedian(a, axis=0)
    mad = _nanmedian(np.abs(a - centre[None, :]), axis=0)
    scale = np.maximum(1.4826 * mad, 0.01 * np.abs(centre))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(scale > 0, (a - centre[None, :]) / scale, 0.0)


def _nanquantile_cols(M: np.ndarray, q: float) -> np.ndarray:
    """Per-step ``q`` quantile over ranks, ignoring missing ranks."""
    if not np.isnan(M).any():
        return np.quantile(M, q, axis=0)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(M, q, axis=0)


def _screen(L: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, how far the medians of blocks of ``width`` steps of its log ratio stray from their median, and
    the noise of those block medians (1.4826 MAD): a cheap test of whether its level moves at all."""
    R, S = L.shape
    width = max(1, min(width, S))
    nb = math.ceil(S / width)
    padded = np.full((R, nb * width), np.nan)
    padded[:, :S] = L
    blocks = _nanmedian(padded.reshape(R, nb, width), axis=2)
    centre = _nanmedian(blocks, axis=1)
    dev = np.abs(blocks - centre[:, None])
    spread = np.nanmax(np.where(np.isfinite(dev), dev, -np.inf), axis=1)
    noise = 1.4826 * _nanmedian(dev, axis=1)
    return np.where(np.isfinite(spread), spread, 0.0), np.nan_to_num(noise, nan=0.0)


def _segments_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """The segments frame with a fixed schema, also when empty."""
    schema = {
        "section": pl.Utf8,
        "rank": pl.Int64,
        "start_step": pl.Int64,
        "end_step": pl.Int64,
        "n_steps": pl.Int64,
        "ratio": pl.Float64,
        "relative_score": pl.Float64,
        "self_slowdown": pl.Float64,
        "slow": pl.Boolean,
    }
    return pl.DataFrame(rows, schema=schema)
