"""Find straggler ranks in per-step timings: NVRx-style relative/individual scores per window, and when each
rank's slowdown began and ended (change points on its duration relative to the fleet).

Input is a long frame ``rank, step, section, duration_s`` (see :func:`read_timings`). Everything is columnar:
one ranks x steps matrix per section, windowed medians with NumPy, and PELT (ruptures) only on the few ranks
that the scores or a quick screen point at. Scores are meant for compute sections or whole steps: in a blocking
collective (``comm``) the slow rank is the one that waits *least*, so it looks fastest there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from gpufleet.diagnose.changepoint import segment_levels
from gpufleet.errors import DiagnoseError

CANONICAL = ("rank", "step", "section", "duration_s")
DEFAULT_SECTION = "step"

#: Column names recognised without ``--columns`` (compared lower-case), in order of preference.
RANK_ALIASES = ("rank", "global_rank", "rank_id", "worker", "worker_id", "process_rank")
STEP_ALIASES = ("step", "global_step", "iteration", "iter", "it", "step_id", "batch_idx", "time")
SECTION_ALIASES = ("section", "phase", "stage", "region")
#: Duration aliases and the factor that turns them into seconds. ``batch_time_norm`` (Alibaba PAI, 0-1000) has
#: no unit; every score is a ratio, so any consistent unit works.
DURATION_ALIASES: dict[str, float] = {
    "duration_s": 1.0,
    "duration": 1.0,
    "seconds": 1.0,
    "step_time_s": 1.0,
    "step_time": 1.0,
    "iter_time": 1.0,
    "iteration_time": 1.0,
    "batch_time": 1.0,
    "batch_time_norm": 1.0,
    "elapsed_s": 1.0,
    "elapsed": 1.0,
    "time_s": 1.0,
    "duration_ms": 1e-3,
    "step_time_ms": 1e-3,
    "iter_time_ms": 1e-3,
    "batch_time_ms": 1e-3,
    "time_ms": 1e-3,
    "elapsed_ms": 1e-3,
    "duration_us": 1e-6,
    "duration_ns": 1e-9,
}
#: Keys accepted by ``--columns`` / ``read_timings(columns=...)``; ``sections`` lists wide-format columns (a+b+c).
MAPPING_KEYS = (
    "rank",
    "step",
    "section",
    "duration",
    "duration_s",
    "duration_ms",
    "duration_us",
    "duration_ns",
    "sections",
)
_UNIT_SUFFIX = {"_s": 1.0, "_ms": 1e-3, "_us": 1e-6, "_ns": 1e-9}
#: Numeric columns never taken for a wide-format section.
_NOT_SECTIONS = {
    "",
    "index",
    "idx",
    "unnamed: 0",
    "gpu",
    "gpus",
    "node",
    "host",
    "hostname",
    "timestamp",
    "ts",
    "wall_time",
    "walltime",
    "epoch",
    "local_rank",
    "world_size",
    "job",
    "job_id",
    "pid",
}
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
_FIX = "name them with --columns rank=COL,step=COL,duration=COL (or duration_ms=COL)"


# ----------------------------------------------------------------------------------------------------- reading


def parse_columns(spec: str | None) -> dict[str, str] | None:
    """Parse ``"rank=worker,step=time,duration=batch_time_norm"`` (the CLI's ``--columns``) into a mapping."""
    if spec is None or not spec.strip():
        return None
    mapping: dict[str, str] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not value:
            raise DiagnoseError(f"--columns: {item.strip()!r} is not KEY=COLUMN; write e.g. rank=worker,step=time")
        if key not in MAPPING_KEYS:
            raise DiagnoseError(f"--columns: unknown key {key!r}; use one of {', '.join(MAPPING_KEYS)}")
        mapping[key] = value
    return mapping


def read_timings(path: str | Path, columns: dict[str, str] | None = None) -> pl.DataFrame:
    """Read per-step timings (CSV or Parquet) into the canonical long frame ``rank, step, section, duration_s``.

    Long format: one row per (rank, step[, section]) with a duration. Recognised names (any case):
    rank <- rank, global_rank, rank_id, worker, worker_id, process_rank;
    step <- step, global_step, iteration, iter, it, step_id, batch_idx, time;
    section <- section, phase, stage, region (default ``"step"``);
    duration <- duration_s, duration, seconds, step_time[_s], iter_time, iteration_time, batch_time,
    batch_time_norm, elapsed[_s], time_s, and ``*_ms``/``_us``/``_ns`` variants (converted to seconds).
    Wide format (an online monitor): rank, step and one numeric column per section (``data, forward, backward,
    optimizer, comm``; a ``_ms`` suffix is converted) - used when no duration or section column is found.
    ``columns`` overrides the names, e.g. ``{"rank": "worker", "step": "time", "duration": "batch_time_norm"}``
    or ``{"sections": "fwd+bwd"}``; see :func:`parse_columns`.
    """
    path = Path(path)
    raw = _read_table(path)
    mapping = {k.lower(): v for k, v in (columns or {}).items()}
    unknown = sorted(set(mapping) - set(MAPPING_KEYS))
    if unknown:
        raise DiagnoseError(f"{path}: unknown --columns key(s) {unknown}; use one of {', '.join(MAPPING_KEYS)}")
    found = raw.columns
    for key, col in mapping.items():
        names = col.replace(";", "+").split("+") if key == "sections" else [col]
        for name in names:
            if name not in found:
                raise DiagnoseError(f"{path}: --columns {key}={name}: no column {name!r}; columns found: {found}")
    rank_col = mapping.get("rank") or _find(found, RANK_ALIASES)
    step_col = mapping.get("step") or _find(found, STEP_ALIASES)
    missing = [name for name, col in (("rank", rank_col), ("step", step_col)) if col is None]
    if missing:
        raise DiagnoseError(f"{path}: no {' or '.join(missing)} column; columns found: {found}; {_FIX}")
    dur_col, scale = _duration_column(found, mapping)
    sec_col = mapping.get("section") or _find(found, SECTION_ALIASES)
    if dur_col is not None:
        long = raw.select(
            _int_column(raw, path, rank_col, "rank"),
            _int_column(raw, path, step_col, "step"),
            (pl.col(sec_col).cast(pl.Utf8) if sec_col else pl.lit(DEFAULT_SECTION)).alias("section"),
            _float_column(raw, path, dur_col, scale),
        )
    elif sec_col is not None:
        raise DiagnoseError(
            f"{path}: a section column ({sec_col!r}) but no duration column; columns found: {found}; {_FIX}"
        )
    else:
        long = _melt_wide(raw, path, rank_col, step_col, mapping.get("sections"))
    return _finish(long, path)


def _read_table(path: Path) -> pl.DataFrame:
    """Read a CSV or Parquet file, turning I/O and parse failures into DiagnoseError."""
    if not path.is_file():
        raise DiagnoseError(f"{path}: no such file; give a CSV or Parquet file of per-step timings")
    parquet = path.suffix.lower() in (".parquet", ".pq")
    try:
        return pl.read_parquet(path) if parquet else pl.read_csv(path, infer_schema_length=10_000)
    except Exception as exc:  # polars raises many types for a bad file
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise DiagnoseError(
            f"{path}: cannot be read as {'Parquet' if parquet else 'CSV'} ({type(exc).__name__}:"
            f" {first}); give a CSV (.csv) or Parquet (.parquet) file"
        ) from exc


def _find(found: list[str], aliases: tuple[str, ...]) -> str | None:
    """The first column whose lower-cased name is in ``aliases``, honouring the aliases' order."""
    lower = {c.lower().strip(): c for c in found}
    return next((lower[a] for a in aliases if a in lower), None)


def _duration_column(found: list[str], mapping: dict[str, str]) -> tuple[str | None, float]:
    """The duration column and its factor to seconds, from the mapping or the aliases."""
    for key, factor in (
        ("duration", 1.0),
        ("duration_s", 1.0),
        ("duration_ms", 1e-3),
        ("duration_us", 1e-6),
        ("duration_ns", 1e-9),
    ):
        if key in mapping:
            return mapping[key], factor
    if "sections" in mapping:
        return None, 1.0
    lower = {c.lower().strip(): c for c in found}
    for alias, factor in DURATION_ALIASES.items():
        if alias in lower:
            return lower[alias], factor
    return None, 1.0


def _int_column(raw: pl.DataFrame, path: Path, col: str, role: str) -> pl.Expr:
    """``col`` as Int64 named ``role``; non-integer values raise DiagnoseError naming file and column."""
    s = raw.get_column(col)
    if s.dtype.is_integer():
        return pl.col(col).cast(pl.Int64).alias(role)
    cast = s.cast(pl.Float64, strict=False)
    bad = cast.is_null() & s.is_not_null()
    frac = cast.fill_null(0.0) % 1 != 0
    if bad.any() or frac.any():
        example = s.filter(bad | frac).head(1).to_list()
        raise DiagnoseError(
            f"{path}: column {col!r} ({role}) holds non-integer values such as {example};"
            f" map an integer {role} column with --columns {role}=COL"
        )
    return pl.col(col).cast(pl.Float64, strict=False).cast(pl.Int64).alias(role)


def _float_column(raw: pl.DataFrame, path: Path, col: str, scale: float) -> pl.Expr:
    """``col`` as seconds (Float64) named ``duration_s``; text that is not a number raises DiagnoseError."""
    s = raw.get_column(col)
    cast = s.cast(pl.Float64, strict=False)
    if (cast.is_null() & s.is_not_null()).any():
        example = s.filter(cast.is_null() & s.is_not_null()).head(1).to_list()
        raise DiagnoseError(
            f"{path}: duration column {col!r} holds non-numbers such as {example};"
            f" map a numeric column with --columns duration=COL"
        )
    return (pl.col(col).cast(pl.Float64, strict=False) * scale).alias("duration_s")


def _melt_wide(raw: pl.DataFrame, path: Path, rank_col: str, step_col: str, sections: str | None) -> pl.DataFrame:
    """Wide monitor output (one column per section) to the long frame; unit suffixes are converted and dropped."""
    if sections:
        cols = sections.replace(";", "+").split("+")
    else:
        cols = [
            c
            for c in raw.columns
            if c not in (rank_col, step_col) and raw.schema[c].is_numeric() and c.lower().strip() not in _NOT_SECTIONS
        ]
    if not cols:
        raise DiagnoseError(
            f"{path}: no duration column and no per-section columns; columns found: {raw.columns};"
            f" {_FIX}, or list wide sections with --columns sections=data+forward+backward"
        )
    parts = []
    for c in cols:
        name, factor = c, 1.0
        for suffix, f in _UNIT_SUFFIX.items():
            if c.lower().endswith(suffix) and len(c) > len(suffix):
                name, factor = c[: -len(suffix)], f
                break
        parts.append(
            raw.select(
                _int_column(raw, path, rank_col, "rank"),
                _int_column(raw, path, step_col, "step"),
                pl.lit(name).alias("section"),
                _float_column(raw, path, c, factor),
            )
        )
    return pl.concat(parts)


def _finish(long: pl.DataFrame, path: Path) -> pl.DataFrame:
    """Drop rows without a duration, refuse negative durations, sort by section, rank, step."""
    long = long.filter(
        pl.col("duration_s").is_not_null()
        & pl.col("duration_s").is_not_nan()
        & pl.col("rank").is_not_null()
        & pl.col("step").is_not_null()
    )
    if long.height == 0:
        raise DiagnoseError(f"{path}: no rows with a rank, a step and a duration; check the file or --columns")
    negative = int((long["duration_s"] < 0).sum())
    if negative:
        raise DiagnoseError(
            f"{path}: {negative} negative duration(s) in the duration column; durations must be"
            " >= 0 (map the right column with --columns duration=COL)"
        )
    return long.sort("section", "rank", "step")


# ------------------------------------------------------------------------------------------------- detection


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
            "ranks": _clean(self.ranks.to_dicts()),
            "segments": _clean(self.segments.to_dicts()),
            "notes": list(self.notes),
        }
        if windows:
            out["windows"] = _clean(self.windows.to_dicts())
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
        res = _SectionAnalysis(
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


class _SectionAnalysis:
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


# ------------------------------------------------------------------------------------------------- helpers


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


def _clean(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replace NaN and infinities by None so that ``json.dumps`` gives valid JSON."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()} for row in rows]
