"""The HTML report of one or more simulation runs: summary table, CDFs, timelines and breakdowns.

It compares policies side by side in one self-contained file (plotly.js inline once) that opens
offline; every large array is downsampled first so the file stays small and fast to write.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl

from gpufleet.report import html
from gpufleet.report.breakdown import NO_VC, SIZE_BUCKETS, breakdown
from gpufleet.report.fmt import format_duration, format_number, format_percent, is_missing, time_axis_unit
from gpufleet.report.plots import cdf_figure, grouped_bar, series_colors, timeline_figure

__all__ = ["RunResult", "gpu_utilisation", "write_sim_report"]


class RunResult(Protocol):
    """What the report reads of one run (``gpufleet.sim.result.SimResult`` has it; the report never imports it).

    ``jobs`` has at least ``vc, num_gpus, jct_s, queue_s`` and ``timeline`` at least ``time_s, busy_gpus,
    queued_jobs``; an elastic run's timeline adds ``loaned_servers``, ``loaned_gpus_used`` and
    ``loaned_gpus`` (GPUs on loan to training), and ``total_gpus`` is the training pool's size.
    """

    policy: str
    summary: dict[str, Any]
    jobs: pl.DataFrame
    timeline: pl.DataFrame
    total_gpus: int


#: Points per CDF curve and buckets per timeline: enough to look exact, small enough to stay light.
CDF_POINTS = 500
TIMELINE_BUCKETS = 2000
#: At most this many VCs (those with most jobs) appear in the per-VC breakdown.
MAX_VCS = 25

_JOB_COLUMNS = ("vc", "num_gpus", "jct_s", "queue_s")
_TIMELINE_COLUMNS = ("time_s", "busy_gpus", "queued_jobs")

# Summary tables, one per topic so each fits a 1,280 px page: heading, then columns of (key, header,
# formatter, which value is best: "min", "max" or None for no mark). A column shows when a run has it.
_SUMMARY_GROUPS: tuple[tuple[str, tuple[tuple[str, str, Any, str | None], ...]], ...] = (
    (
        "Jobs: completion time and queueing",
        (
            ("jobs", "jobs", format_number, None),
            ("finished", "finished", format_number, None),
            ("avg_jct_s", "avg JCT", format_duration, "min"),
            ("median_jct_s", "median JCT", format_duration, "min"),
            ("p95_jct_s", "p95 JCT", format_duration, "min"),
            ("p99_jct_s", "p99 JCT", format_duration, "min"),
            ("avg_queue_s", "avg queue", format_duration, "min"),
            ("median_queue_s", "median queue", format_duration, "min"),
            ("p95_queue_s", "p95 queue", format_duration, "min"),
            ("p99_queue_s", "p99 queue", format_duration, "min"),
        ),
    ),
    (
        "Cluster",
        (
            ("gpu_util", "GPU util", format_percent, "max"),
            ("usage", "usage (both pools)", format_percent, "max"),
            ("makespan_s", "makespan", format_duration, "min"),
            ("preemptions", "preemptions", format_number, None),
            ("lost_work_gpu_h", "lost work (GPU-h)", format_number, None),
            ("unschedulable", "unschedulable", format_number, None),
            ("events", "events", format_number, None),
            ("wall_s", "sim wall time", format_duration, None),
        ),
    ),
    (
        "Capacity loaning and elastic jobs",
        (
            ("loaned_gpu_hours", "loaned GPU-h", format_number, None),
            ("reclaims", "servers reclaimed", format_number, None),
            ("reclaim_preemptions", "reclaim preemptions", format_number, "min"),
            ("scale_events", "scale events", format_number, None),
            ("elastic_jobs", "elastic jobs", format_number, None),
        ),
    ),
)
#: Summary keys no group names (failure runs add a dozen) go into further tables of at most this many columns.
EXTRA_COLUMNS_PER_TABLE = 8


def write_sim_report(
    results: Sequence[RunResult],
    path: str | Path,
    *,
    title: str = "gpufleet simulation",
    context: Mapping[str, str] | None = None,
) -> Path:
    """Write a self-contained HTML report comparing ``results`` (one per policy) to ``path``; return it.

    The page holds a header with ``context`` (trace, cluster, options, ...), the summary table, JCT
    and queueing-delay CDFs, GPU utilisation and queue length over time, and average JCT / queueing
    per VC and per job size, with one colour per policy throughout. Unfinished jobs (NaN finish) are
    counted in the table but left out of the CDFs and averages.
    """
    if not results:
        raise ValueError("write_sim_report needs at least one SimResult")
    for r in results:
        _check_columns(r)
    labels = _labels(results)
    colors = series_colors(labels)
    figs = _Figures()
    body = [
        _header(results, context),
        html.section(
            "Summary",
            _summary_tables(results, labels),
            note="Durations over finished jobs. GPU util is busy GPU-time of the training pool over its GPU-time; "
            "usage is GPU-time allocated to training and inference over the capacity of both pools.",
        ),
        _cdf_section(results, labels, colors, figs),
        _timeline_section(results, labels, colors, figs),
        _vc_section(results, labels, colors, figs),
        _size_section(results, labels, colors, figs),
    ]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html.page(title, body, footer=_footer(len(results))), encoding="utf-8")
    return out


class _Figures:
    """Turns figures into HTML in page order; the first one carries the plotly.js bundle."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, *figs: Any) -> str:
        parts = []
        for fig in figs:
            parts.append(html.figure_div(fig, div_id=f"fig-{self.count}", include_plotlyjs=self.count == 0))
            self.count += 1
        return "".join(parts)

    def grid(self, *figs: Any) -> str:
        return f'<div class="grid">{self.add(*figs)}</div>'


def _check_columns(result: RunResult) -> None:
    for frame_name, frame, needed in (
        ("jobs", result.jobs, _JOB_COLUMNS),
        ("timeline", result.timeline, _TIMELINE_COLUMNS),
    ):
        missing = [c for c in needed if c not in frame.columns]
        if missing:
            raise ValueError(
                f"the run of policy {result.policy!r}: its {frame_name} frame lacks column(s) {missing}; "
                "see gpufleet.sim.result for the column contract"
            )


def _labels(results: Sequence[RunResult]) -> list[str]:
    """Policy names as legend labels; a name used twice gets a suffix so curves stay apart."""
    seen: dict[str, int] = {}
    labels = []
    for r in results:
        seen[r.policy] = seen.get(r.policy, 0) + 1
        labels.append(r.policy if seen[r.policy] == 1 else f"{r.policy} ({seen[r.policy]})")
    return labels


def _header(results: Sequence[RunResult], context: Mapping[str, str] | None) -> str:
    items: dict[str, object] = dict(context or {})
    items.setdefault("policies", ", ".join(r.policy for r in results))
    gpus = sorted({r.total_gpus for r in results})
    items.setdefault("GPUs", ", ".join(format_number(g) for g in gpus))
    return html.kv_table(items)


def _footer(n_runs: int) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("gpufleet")
    except PackageNotFoundError:  # running from a source tree that was never installed
        release = "(source)"
    return f"gpufleet {release} · simulation report of {n_runs} run{'s' if n_runs != 1 else ''}"


def _summary_tables(results: Sequence[RunResult], labels: Sequence[str]) -> str:
    """One table per topic of :data:`_SUMMARY_GROUPS` (only the columns some run has), then the other keys."""
    known = {key for _, group in _SUMMARY_GROUPS for key, *_ in group} | {"policy"}
    extra = [k for k in dict.fromkeys(k for r in results for k in r.summary) if k not in known]
    groups = [
        (heading, [c for c in group if any(c[0] in r.summary for r in results)]) for heading, group in _SUMMARY_GROUPS
    ]
    extra_columns = [
        (k, k.replace("_", " "), format_duration if k.endswith("_s") else format_number, None) for k in extra
    ]
    for first in range(0, len(extra_columns), EXTRA_COLUMNS_PER_TABLE):
        groups.append(("Other figures" if first == 0 else "", extra_columns[first : first + EXTRA_COLUMNS_PER_TABLE]))
    parts = []
    for heading, columns in groups:
        if columns:
            title = f"<h3>{escape(heading)}</h3>" if heading else ""
            parts.append(title + _summary_table(results, labels, columns))
    return "".join(parts)


def _summary_table(
    results: Sequence[RunResult], labels: Sequence[str], columns: Sequence[tuple[str, str, Any, str | None]]
) -> str:
    header = ["policy", *(head for _, head, _, _ in columns)]
    rows = [
        [label] + [fmt(r.summary.get(key)) for key, _, fmt, _ in columns]
        for r, label in zip(results, labels, strict=True)
    ]
    classes = [[""] * len(header) for _ in results]
    if len(results) > 1:
        for j, (key, _, _, best) in enumerate(columns, start=1):
            values = [_as_float(r.summary.get(key)) for r in results]
            finite = [v for v in values if math.isfinite(v)]
            if best is None or len(finite) < 2 or min(finite) == max(finite):
                continue
            target = min(finite) if best == "min" else max(finite)
            for i, v in enumerate(values):
                if v == target:
                    classes[i][j] = "best"
    return html.table(header, rows, cell_classes=classes)


def _as_float(value: Any) -> float:
    try:
        return math.nan if is_missing(value) else float(value)
    except (TypeError, ValueError):
        return math.nan


def _column(frame: pl.DataFrame, name: str) -> np.ndarray:
    return frame.get_column(name).cast(pl.Float64).to_numpy()


def _cdf_section(results: Sequence[RunResult], labels: Sequence[str], colors: Mapping[str, str], figs: _Figures) -> str:
    jct = {label: _column(r.jobs, "jct_s") for r, label in zip(results, labels, strict=True)}
    queue = {label: _column(r.jobs, "queue_s") for r, label in zip(results, labels, strict=True)}
    jct_fig = cdf_figure(
        jct, title="Job completion time (CDF)", x_title="JCT (log scale)", colors=colors, n_points=CDF_POINTS
    )
    queue_fig = cdf_figure(
        queue,
        title="Queueing delay (CDF)",
        x_title="time waiting for GPUs (log scale)",
        zero_label="no wait",
        colors=colors,
        n_points=CDF_POINTS,
    )
    return html.section(
        "Distributions",
        figs.grid(jct_fig, queue_fig),
        note="Over finished jobs. A queueing curve starts at the share of jobs that never waited.",
    )


def _loan_figures(
    results: Sequence[RunResult], labels: Sequence[str], colors: Mapping[str, str], common: Mapping[str, Any]
) -> list[Any]:
    """Aryl runs: inference servers needed and servers on loan over time, and training GPUs on loaned servers."""
    loaned: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    used: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    demand = None
    for r, label in zip(results, labels, strict=True):
        if "loaned_servers" not in r.timeline.columns:
            continue
        time = _column(r.timeline, "time_s")
        loaned[label] = (time, _column(r.timeline, "loaned_servers"))
        used[label] = (time, _column(r.timeline, "loaned_gpus_used"))
        if demand is None and "inference_servers_needed" in r.timeline.columns:
            demand = (time, _column(r.timeline, "inference_servers_needed"))
    if not loaned:
        return []
    series = dict(loaned)
    palette = dict(colors)
    if demand is not None:
        series = {"inference servers needed": demand, **series}
        palette["inference servers needed"] = "#444444"
    figs = [
        timeline_figure(
            series, title="Inference demand and servers on loan", y_title="servers", **{**common, "colors": palette}
        ),
        timeline_figure(used, title="Training GPUs on loaned servers", y_title="GPUs", **common),
    ]
    for fig in figs:  # name the run even when only one of the compared runs loans servers
        fig.update_layout(showlegend=True)
    return figs


def gpu_utilisation(result: RunResult) -> np.ndarray | None:
    """Busy GPUs over the GPUs that can run training, per timeline row: the training pool plus servers on loan.

    Busy GPUs of an elastic run include those on loaned inference servers, so dividing by the training
    pool alone would pass 100 % (Aryl showed 200 %); None when the run has no GPUs.
    """
    busy = _column(result.timeline, "busy_gpus")
    if "loaned_gpus" in result.timeline.columns:
        # never below one GPU: with no GPU at all none is busy, and 0 / 1 plots as 0 %
        return busy / np.maximum(result.total_gpus + _column(result.timeline, "loaned_gpus"), 1.0)
    return busy / result.total_gpus if result.total_gpus > 0 else None


def _timeline_section(
    results: Sequence[RunResult], labels: Sequence[str], colors: Mapping[str, str], figs: _Figures
) -> str:
    start, end = 0.0, 0.0
    for r in results:
        if r.timeline.height:
            t = r.timeline.get_column("time_s")
            start, end = min(start, float(t.min())), max(end, float(t.max()))
        makespan = _as_float(r.summary.get("makespan_s"))
        if math.isfinite(makespan):
            end = max(end, makespan)
    if not end > start:
        return html.section("Over time", note="The runs have no timeline to plot.")
    unit = time_axis_unit(end - start)
    util: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    queued: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for r, label in zip(results, labels, strict=True):
        time = _column(r.timeline, "time_s")
        share = gpu_utilisation(r)
        if share is not None:
            util[label] = (time, share)
        queued[label] = (time, _column(r.timeline, "queued_jobs"))
    common = {
        "end_time": end,
        "start_time": start,
        "n_buckets": TIMELINE_BUCKETS,
        "time_unit": unit,
        "colors": colors,
    }
    util_fig = timeline_figure(
        util, title="GPU utilisation", y_title="busy GPUs / GPUs that can train", y_percent=True, **common
    )
    queue_fig = timeline_figure(queued, title="Queue length", y_title="jobs waiting", **common)
    extra = _loan_figures(results, labels, colors, common)
    width = end - start
    bucket = format_duration(width / TIMELINE_BUCKETS)
    return html.section(
        "Over time",
        figs.add(util_fig, queue_fig, *extra),
        note=f"Time-weighted averages over {TIMELINE_BUCKETS:,} buckets of {bucket} each.",
    )


def _vc_section(results: Sequence[RunResult], labels: Sequence[str], colors: Mapping[str, str], figs: _Figures) -> str:
    frames = [breakdown(r.jobs, "vc") for r in results]
    jobs_per_vc: dict[str, int] = {}
    for frame in frames:
        for group, jobs in frame.select("group", "jobs").iter_rows():
            jobs_per_vc[group] = jobs_per_vc.get(group, 0) + jobs
    if len(jobs_per_vc) < 2:
        return ""  # no VCs in the trace (or one): nothing to compare
    top = set(sorted(jobs_per_vc, key=lambda g: (-jobs_per_vc[g], g))[:MAX_VCS])
    order = sorted(top, key=lambda g: (g == NO_VC, g))
    note = "Averages over finished jobs of each virtual cluster."
    if len(jobs_per_vc) > MAX_VCS:
        note += f" The {MAX_VCS} VCs with most jobs, of {len(jobs_per_vc)}."
    bars = _bars(frames, labels, order, colors, what="VC", x_title="virtual cluster")
    return html.section("Per virtual cluster", figs.grid(*bars), note=note)


def _size_section(
    results: Sequence[RunResult], labels: Sequence[str], colors: Mapping[str, str], figs: _Figures
) -> str:
    frames = [breakdown(r.jobs, "size") for r in results]
    present = {g for f in frames for g in f.get_column("group").to_list()}
    order = [label for label, _, _ in SIZE_BUCKETS if label in present]
    if not order:
        return ""
    bars = _bars(frames, labels, order, colors, what="job size", x_title="GPUs per job")
    note = "Jobs bucketed by the GPUs they request; averages over finished jobs."
    return html.section("Per job size", figs.grid(*bars), note=note)


def _bars(
    frames: Sequence[pl.DataFrame],
    labels: Sequence[str],
    order: Sequence[str],
    colors: Mapping[str, str],
    *,
    what: str,
    x_title: str,
) -> list[Any]:
    """Grouped bars of avg JCT and avg queueing delay per group, one bar per policy."""
    out = []
    for metric, name in (("avg_jct_s", "avg JCT"), ("avg_queue_s", "avg queueing delay")):
        series = {}
        for frame, label in zip(frames, labels, strict=True):
            values = dict(zip(frame.get_column("group").to_list(), frame.get_column(metric).to_list(), strict=True))
            series[label] = [values.get(g) for g in order]
        out.append(grouped_bar(order, series, title=f"{name} per {what}", y_title=name, x_title=x_title, colors=colors))
    return out
