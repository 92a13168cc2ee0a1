"""Find straggler ranks in per-step timings: NVRx-style relative/individual scores per window, and when each
rank's slowdown began and ended (change points on its duration relative to the fleet).

Input is a long frame ``rank, step, section, duration_s`` (see :func:`read_timings`). Everything is columnar:
one ranks x steps matrix per section, windowed medians with NumPy, and PELT (ruptures) only on the few ranks
that the scores or a quick screen point at. Scores are meant for compute sections or whole steps: in a blocking
collective (``comm``) the slow rank is the one that waits *least*, so it looks fastest there.

This module is the API (:func:`detect_stragglers` and its :class:`StragglerReport`); reading the timings is
:mod:`gpufleet.diagnose.step_timings` (re-exported here), the scores of one section
:mod:`gpufleet.diagnose.straggler_analysis`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gpufleet.diagnose.step_timings import CANONICAL, parse_columns, read_timings
from gpufleet.diagnose.straggler_analysis import SectionAnalysis
from gpufleet.errors import DiagnoseError
from gpufleet.report.fmt import clean_json

__all__ = ["CANONICAL", "StragglerReport", "detect_stragglers", "parse_columns", "read_timings"]

_COLLECTIVE_HINTS = (
    "comm",
    "allreduce",
    "all_reduce",
    "allgather",
    "all_gather",
    "reduce_scatter",
    "nccl",
    "collective",
    "barrier",
)


@dataclass
class StragglerReport:
    """What :func:`detect_stragglers` found.

    ``ranks``: one row per (section, rank) - n_steps, median_s, relative_score, individual_score, z,
    worst_window_score, windows_flagged, n_windows, is_straggler, first_slow_step, recovered_step (null while
    still slow), episodes, worst_step, slowdown (x the fastest rank in its worst slow segment), self_slowdown
    (x its own best segment), reason (one line).
    ``windows``: one row per (section, window, rank) for a heat map - start_step, end_step, n, median_s,
    relative_score, individual_score, z, flagged.
    ``segments``: the change-point segments of the ranks that were analysed - start_step, end_step, n_steps,
    ratio (to the fleet reference), relative_score, self_slowdown, slow (part of a slow episode).
    ``params``: the arguments, plus the window and minimum segment resolved per section; ``notes``: caveats.
    """

    ranks: pl.DataFrame
    windows: pl.DataFrame
    segments: pl.DataFrame
    params: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def stragglers(self) -> pl.DataFrame:
        """The straggler rows of ``ranks``, slowest first."""
        return self.ranks.filter(pl.col("is_straggler")).sort("relative_score", "worst_window_score")

    def to_dict(self, windows: bool = True) -> dict[str, Any]:
        """JSON-ready dict (NaN becomes None); ``windows=False`` leaves the per-window frame out."""
        out: dict[str, Any] = {
            "params": dict(self.params),
            "stragglers": self.stragglers.select("section", "rank").to_dicts(),
            "ranks": clean_json(self.ranks.to_dicts()),
            "segments": clean_json(self.segments.to_dicts()),
            "notes": list(self.notes),
        }
        if windows:
            out["windows"] = clean_json(self.windows.to_dicts())
        return out


def detect_stragglers(
    frame: pl.DataFrame,
    threshold: float = 0.75,
    window: int | None = None,
    *,
    min_slowdown: float = 1.2,
    reference_quantile: float = 0.25,
    min_segment: int | None = None,
    penalty_scale: float = 3.0,
    max_changepoint_ranks: int = 64,
) -> StragglerReport:
    """Score every rank of every section and find when the stragglers' slowdowns began and ended.

    Per window of ``window`` recorded steps (default: about 1/20 of the run, 5..100): each rank's median
    duration m; relative score = min over ranks of m / m; individual score = the rank's best median so far / m;
    z = (m - median over ranks) / (1.4826 MAD over ranks, at least 1% of the median). A window is flagged when
    its relative score < ``threshold`` (NVRx default 0.75). Change points (PELT, l2) run on
    log(duration / per-step ``reference_quantile`` of all ranks) of the flagged or visibly moving ranks. A
    segment is slow when its relative score < ``threshold`` or it is ``min_slowdown`` times slower than the
    rank's own best segment. A rank is a straggler when its whole-run relative score < ``threshold`` or one of its
    segments is slow; a flagged window alone is evidence, not a verdict.
    """
    _check_frame(frame)
    if not 0.0 < threshold <= 1.0:
        raise DiagnoseError(f"threshold={threshold}: must be in (0, 1]; NVRx uses 0.75")
    if window is not None and window < 1:
        raise DiagnoseError(f"window={window}: must be a positive number of steps")
    if min_slowdown <= 1.0:
        raise DiagnoseError(f"min_slowdown={min_slowdown}: must be > 1 (1.2 = 20% slower than the rank's best)")
    if not 0.0 <= reference_quantile <= 1.0:
        raise DiagnoseError(f"reference_quantile={reference_quantile}: must be in [0, 1]")
    notes: list[str] = []
    data = frame.filter(pl.col("duration_s").is_finite() & (pl.col("duration_s") > 0))
    if data.height < frame.height:
        notes.append(f"{frame.height - data.height} rows with a zero, negative or missing duration were ignored")
    params: dict[str, Any] = {
        "threshold": threshold,
        "window": window,
        "min_slowdown": min_slowdown,
        "reference_quantile": reference_quantile,
        "min_segment": min_segment,
        "penalty_scale": penalty_scale,
        "max_changepoint_ranks": max_changepoint_ranks,
    }
    ranks, windows, segments = [], [], []
    for section in sorted(data["section"].unique().to_list()):
        sub = data.filter(pl.col("section") == section)
        res = SectionAnalysis(
            section,
            sub,
            threshold,
            window,
            min_slowdown,
            reference_quantile,
            min_segment,
            penalty_scale,
            max_changepoint_ranks,
        )
        ranks.append(res.ranks)
        windows.append(res.windows)
        segments.append(res.segments)
        notes.extend(res.notes)
        params.setdefault("windows_by_section", {})[section] = res.window
        params.setdefault("min_segment_by_section", {})[section] = res.min_segment
        if any(h in section.lower() for h in _COLLECTIVE_HINTS):
            notes.append(
                f"section {section!r} looks like a blocking collective: there the straggler is the rank"
                " that waits least (the fastest); read scores of compute sections or whole steps"
            )
    if not ranks:
        raise DiagnoseError("timings: no rows with a positive duration; nothing to score")
    return StragglerReport(pl.concat(ranks), pl.concat(windows), pl.concat(segments), params, notes)


def _check_frame(frame: pl.DataFrame) -> None:
    """Refuse a frame without the canonical columns (it did not come from :func:`read_timings`)."""
    missing = [c for c in CANONICAL if c not in frame.columns]
    if missing:
        raise DiagnoseError(
            f"timings frame: missing column(s) {missing}; columns found: {frame.columns};"
            " build it with gpufleet.diagnose.stragglers.read_timings"
        )
