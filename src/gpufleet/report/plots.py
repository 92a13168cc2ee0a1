"""Plotly figures shared by reports: CDFs, step-function timelines and grouped bars, one colour per series.

Every function downsamples before plotting (see :mod:`gpufleet.report.resample`) so figures stay small
however large the run, and imports plotly only when called so ``import gpufleet.report`` stays light.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from gpufleet.report.fmt import duration_unit, format_duration, time_axis_unit
from gpufleet.report.resample import quantile_points, time_weighted_resample

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["PALETTE", "cdf_figure", "grouped_bar", "house_layout", "series_colors", "timeline_figure"]

#: Colours given to series in order (Tableau 10): colour-blind friendly and distinct in print.
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)

_LOG_TICKS_S = (
    (0.01, "10 ms"),
    (0.1, "0.1 s"),
    (1.0, "1 s"),
    (10.0, "10 s"),
    (60.0, "1 min"),
    (600.0, "10 min"),
    (3600.0, "1 h"),
    (36000.0, "10 h"),
    (86400.0, "1 d"),
    (864000.0, "10 d"),
    (8640000.0, "100 d"),
)


def series_colors(names: Iterable[str]) -> dict[str, str]:
    """Map each name to a colour of :data:`PALETTE`, in order, so a policy looks the same in every figure."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(dict.fromkeys(names))}


def _colors(names: Iterable[str], colors: Mapping[str, str] | None) -> dict[str, str]:
    names = list(names)
    auto = series_colors(names)
    return {n: (colors or {}).get(n, auto[n]) for n in names}


_AXIS = {"gridcolor": "#e6e9ef", "linecolor": "#aab2bd", "zerolinecolor": "#d0d5dd", "automargin": True}


def house_layout(
    *,
    title: str,
    x_title: str = "",
    y_title: str = "",
    xaxis: Mapping[str, Any] | None = None,
    yaxis: Mapping[str, Any] | None = None,
    **layout: Any,
) -> dict[str, Any]:
    """The layout every report figure shares: title top left, legend under the plot, light axes.

    The legend sits at the bottom of the figure (``yref="container"``) and pushes the bottom margin, so
    however many rows it wraps to it never covers the title, the plot or the axis titles.
    """
    base = {
        "template": "none",
        "title": {"text": title, "x": 0.0, "xanchor": "left"},
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "margin": {"l": 64, "r": 24, "t": 56, "b": 24},
        "legend": {"orientation": "h", "x": 0.0, "xanchor": "left", "y": 0.0, "yanchor": "bottom", "yref": "container"},
        "xaxis": {"title": {"text": x_title}, **_AXIS, **(xaxis or {})},
        "yaxis": {"title": {"text": y_title}, **_AXIS, **(yaxis or {})},
    }
    return {**base, **layout}


def _figure(
    traces: list[dict[str, Any]],
    *,
    title: str,
    x_title: str,
    y_title: str,
    xaxis: Mapping[str, Any] | None = None,
    yaxis: Mapping[str, Any] | None = None,
    **layout: Any,
) -> go.Figure:
    """One figure from plain trace dicts and the house style, built in one validated step.

    A small explicit style instead of a named template: templates are slow to copy and large to
    embed; and one constructor call instead of repeated ``update_layout`` keeps figures cheap.
    """
    import plotly.graph_objects as go

    style = house_layout(title=title, x_title=x_title, y_title=y_title, xaxis=xaxis, yaxis=yaxis, **layout)
    return go.Figure(data=traces, layout=style)


def _log_seconds_ticks(lo: float, hi: float) -> dict[str, list[Any]]:
    ticks = [(v, label) for v, label in _LOG_TICKS_S if lo / 1.5 <= v <= hi * 1.5]
    if len(ticks) < 2:
        return {}
    return {"tickvals": [v for v, _ in ticks], "ticktext": [label for _, label in ticks]}


def cdf_figure(
    samples: Mapping[str, ArrayLike],
    *,
    title: str,
    x_title: str,
    log_x: bool = True,
    seconds: bool = True,
    zero_label: str = "at 0",
    colors: Mapping[str, str] | None = None,
    n_points: int = 500,
) -> go.Figure:
    """Empirical CDF of each named sample, evaluated at ``n_points`` quantiles.

    NaN values (unfinished jobs) are left out, so each curve is over the finite values. With ``log_x``,
    values <= 0 cannot be placed on the axis: their share becomes the curve's starting height and is
    named in the legend (``"fifo (40% no wait)"`` with ``zero_label="no wait"``). ``seconds`` labels the
    axis and hover text as durations.
    """
    palette = _colors(samples, colors)
    traces = []
    lo, hi = math.inf, -math.inf
    for name, values in samples.items():
        arr = np.asarray(values, dtype=np.float64).ravel()
        arr = arr[np.isfinite(arr)]
        label, start = name, 0.0
        if log_x and arr.size:
            positive = arr[arr > 0]
            start = 1.0 - positive.size / arr.size
            if start > 0:
                label = f"{name} ({start:.0%} {zero_label})"
            arr = positive
        x, p = quantile_points(arr, n_points)
        y = start + (1.0 - start) * p
        if x.size:
            lo, hi = min(lo, float(x[0])), max(hi, float(x[-1]))
        trace = {
            "type": "scatter",
            "x": x,
            "y": y,
            "name": label,
            "mode": "lines",
            "line": {"color": palette[name], "width": 2},
            "hovertemplate": ("%{customdata}" if seconds else "%{x:.4g}")
            + f": %{{y:.1%}}<extra>{escape(name)}</extra>",
        }
        if seconds:
            trace["customdata"] = [format_duration(v) for v in x]
        traces.append(trace)
    xaxis: dict[str, Any] = {}
    if log_x:
        xaxis["type"] = "log"
        if 0 < lo <= hi:  # the whole range, shortest to longest, however skewed (log10 units)
            pad = max(0.02 * (math.log10(hi) - math.log10(lo)), 0.05)
            xaxis["range"] = [math.log10(lo) - pad, math.log10(hi) + pad]
        if seconds and hi > 0:
            xaxis.update(_log_seconds_ticks(lo, hi))
    return _figure(
        traces,
        title=title,
        x_title=x_title,
        y_title="share of jobs",
        xaxis=xaxis,
        yaxis={"range": [0, 1.02], "tickformat": ".0%"},
        hovermode="closest",
    )


def timeline_figure(
    series: Mapping[str, tuple[ArrayLike, ArrayLike]],
    *,
    title: str,
    y_title: str,
    end_time: float,
    start_time: float = 0.0,
    n_buckets: int = 2000,
    time_unit: tuple[str, float] | None = None,
    y_percent: bool = False,
    colors: Mapping[str, str] | None = None,
) -> go.Figure:
    """Step functions over time (``name -> (time_s, value)``), each averaged over ``n_buckets`` buckets.

    All series share one bucket grid from ``start_time`` to ``end_time`` (seconds); each value holds
    until the next event and the last one until ``end_time``. The x axis is in hours, or days when
    the span is over three days, unless ``time_unit`` (``("h", 3600.0)``) says otherwise.
    ``y_percent`` formats the y axis as a percentage of 1.
    """
    unit, scale = time_unit or time_axis_unit(end_time - start_time)
    palette = _colors(series, colors)
    y_format = "%{y:.1%}" if y_percent else "%{y:.3g}"
    traces = []
    for name, (time, value) in series.items():
        t = np.asarray(time, dtype=np.float64)
        if t.size == 0:
            continue
        starts, means = time_weighted_resample(t, value, n_buckets, end_time, start_time)
        # Bucket means are constant over each bucket: draw them as steps ending at end_time.
        traces.append(
            {
                "type": "scatter",
                "x": np.append(starts, end_time) / scale,
                "y": np.append(means, means[-1]),
                "name": name,
                "mode": "lines",
                "line": {"color": palette[name], "width": 1.5, "shape": "hv"},
                "hovertemplate": f"%{{x:.2f}} {unit}: {y_format}<extra>{escape(name)}</extra>",
            }
        )
    yaxis: dict[str, Any] = {"rangemode": "tozero"}
    if y_percent:
        yaxis["tickformat"] = ".0%"
    return _figure(
        traces,
        title=title,
        x_title=f"time since trace start ({unit})",
        y_title=y_title,
        xaxis={"range": [start_time / scale, end_time / scale]},
        yaxis=yaxis,
        hovermode="x",
    )


def grouped_bar(
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    title: str,
    y_title: str,
    x_title: str = "",
    seconds: bool = True,
    colors: Mapping[str, str] | None = None,
) -> go.Figure:
    """One bar per (group, series): ``series[name][i]`` is the bar of ``name`` in ``groups[i]``.

    Missing values (None/NaN) leave a gap. With ``seconds`` the values are durations: the axis takes
    a readable unit (s, min, h or d) from the largest value and the hover text shows the duration.
    """
    cleaned = {
        name: np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
        for name, values in series.items()
    }
    for name, values in cleaned.items():
        if values.size != len(groups):
            raise ValueError(f"grouped_bar: series {name!r} has {values.size} values for {len(groups)} groups")
    scale = 1.0
    if seconds:
        finite = [v[np.isfinite(v)] for v in cleaned.values()]
        largest = max((float(v.max()) for v in finite if v.size), default=0.0)
        unit, scale = duration_unit(largest)
        y_title = f"{y_title} ({unit})"
    palette = _colors(series, colors)
    x = [str(g) for g in groups]
    traces = []
    for name, values in cleaned.items():
        trace = {
            "type": "bar",
            "x": x,
            "y": values / scale,
            "name": name,
            "marker": {"color": palette[name]},
            "hovertemplate": ("%{customdata}" if seconds else "%{y:.4g}") + f"<extra>{escape(name)}</extra>",
        }
        if seconds:
            trace["customdata"] = [format_duration(v) for v in values]
        traces.append(trace)
    return _figure(
        traces,
        title=title,
        x_title=x_title,
        y_title=y_title,
        xaxis={"type": "category"},
        barmode="group",
        hovermode="x",
    )
