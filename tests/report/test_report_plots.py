"""Figure builders: CDF start at the zero share, step timelines, grouped bars, fixed colours."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.report.plots import PALETTE, cdf_figure, grouped_bar, series_colors, timeline_figure

COLORS = {"fifo": "#111111", "sjf": "#222222"}


def test_series_colors_are_stable_and_distinct() -> None:
    colors = series_colors(["fifo", "sjf", "aryl", "fifo"])
    assert list(colors) == ["fifo", "sjf", "aryl"]
    assert colors["fifo"] == PALETTE[0] and len(set(colors.values())) == 3


def test_cdf_starts_at_share_of_zero_values() -> None:
    fig = cdf_figure(
        {"fifo": [0.0, 0.0, 0.0, 10.0, 100.0, np.nan], "sjf": [5.0, 50.0]},
        title="queue",
        x_title="wait",
        zero_label="no wait",
        colors=COLORS,
        n_points=50,
    )
    fifo, sjf = fig.data
    assert fifo.name == "fifo (60% no wait)"
    assert fifo.y[0] == pytest.approx(0.6) and fifo.y[-1] == pytest.approx(1.0)
    assert fifo.x[0] == pytest.approx(10.0) and len(fifo.x) == 50
    assert sjf.name == "sjf" and sjf.y[0] == pytest.approx(0.0)
    assert fig.layout.xaxis.type == "log"
    assert [t.line.color for t in fig.data] == ["#111111", "#222222"]


def test_cdf_of_all_zero_or_empty_samples_does_not_break() -> None:
    fig = cdf_figure({"fifo": [0.0, 0.0], "sjf": []}, title="t", x_title="x", zero_label="no wait")
    assert fig.data[0].name == "fifo (100% no wait)"
    assert len(fig.data[0].x) == 0 and len(fig.data[1].x) == 0


def test_timeline_is_resampled_steps_in_days_for_long_spans() -> None:
    n = 100_000
    time = np.linspace(0.0, 10 * 86400.0, n)
    busy = np.full(n, 8.0)
    fig = timeline_figure(
        {"fifo": (time, busy / 16), "sjf": ([], [])},
        title="util",
        y_title="share",
        end_time=10 * 86400.0,
        n_buckets=200,
        y_percent=True,
        colors=COLORS,
    )
    assert len(fig.data) == 1  # an empty series is left out
    trace = fig.data[0]
    assert len(trace.x) == 201 and trace.line.shape == "hv" and trace.line.color == "#111111"
    assert trace.x[-1] == pytest.approx(10.0)  # days
    np.testing.assert_allclose(trace.y, 0.5)
    assert "(d)" in fig.layout.xaxis.title.text


def test_timeline_uses_hours_for_short_spans() -> None:
    fig = timeline_figure({"fifo": ([0.0, 3600.0], [1, 2])}, title="q", y_title="jobs", end_time=7200.0)
    assert "(h)" in fig.layout.xaxis.title.text
    assert fig.data[0].x[-1] == pytest.approx(2.0)


def test_grouped_bar_picks_a_duration_unit_and_keeps_gaps() -> None:
    fig = grouped_bar(
        ["a", "b"],
        {"fifo": [7200.0, None], "sjf": [3600.0, 10800.0]},
        title="avg JCT per VC",
        y_title="avg JCT",
        colors=COLORS,
    )
    assert fig.layout.yaxis.title.text == "avg JCT (h)"
    assert fig.layout.barmode == "group"
    fifo, sjf = fig.data
    assert fifo.y[0] == pytest.approx(2.0) and np.isnan(fifo.y[1])
    assert sjf.y[1] == pytest.approx(3.0)
    assert [t.marker.color for t in fig.data] == ["#111111", "#222222"]
    with pytest.raises(ValueError, match="2 groups"):
        grouped_bar(["a", "b"], {"fifo": [1.0]}, title="t", y_title="y")
