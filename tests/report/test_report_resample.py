"""Downsampling helpers: hand-computed cases and properties (integral kept, quantiles monotone)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.report.resample import quantile_points, time_weighted_resample


def test_resample_hand_example() -> None:
    # 0 GPUs busy for 10 s, then 4 for 30 s; two 20 s buckets: (0*10 + 4*10)/20 = 2, then 4.
    starts, means = time_weighted_resample([0.0, 10.0], [0, 4], 2, end_time=40.0)
    np.testing.assert_allclose(starts, [0.0, 20.0])
    np.testing.assert_allclose(means, [2.0, 4.0])


def test_resample_last_event_at_a_time_wins() -> None:
    _, means = time_weighted_resample([0.0, 0.0, 10.0], [5, 3, 1], 2, end_time=20.0)
    np.testing.assert_allclose(means, [3.0, 1.0])


def test_resample_value_is_zero_before_first_event() -> None:
    _, means = time_weighted_resample([10.0], [4], 1, end_time=20.0, start_time=0.0)
    np.testing.assert_allclose(means, [2.0])


def test_resample_window_inside_events_and_unsorted_input() -> None:
    # Events after end_time are ignored; a start after the first event uses the value then holding.
    _, means = time_weighted_resample([50.0, 10.0, 0.0], [100, 4, 0], 2, end_time=45.0, start_time=5.0)
    np.testing.assert_allclose(means, [(0 * 5 + 4 * 15) / 20, 4.0])


def test_resample_empty_series_is_zero() -> None:
    starts, means = time_weighted_resample([], [], 4, end_time=8.0, start_time=0.0)
    np.testing.assert_allclose(starts, [0, 2, 4, 6])
    np.testing.assert_allclose(means, [0, 0, 0, 0])


@pytest.mark.parametrize(
    ("time", "value", "n", "end"),
    [([0.0, 1.0], [1.0], 2, 5.0), ([0.0], [1.0], 0, 5.0), ([0.0, 1.0], [1.0, 2.0], 2, 0.0)],
)
def test_resample_rejects_bad_input(time: list[float], value: list[float], n: int, end: float) -> None:
    with pytest.raises(ValueError):
        time_weighted_resample(time, value, n, end_time=end)


def _step_integral(time: np.ndarray, value: np.ndarray, start: float, end: float) -> float:
    """Integral of the step function over [start, end], one segment at a time (the slow, obvious way)."""
    total = 0.0
    for i in range(len(time)):
        seg_start = max(time[i], start)
        seg_end = min(time[i + 1] if i + 1 < len(time) else end, end)
        if seg_end > seg_start:
            total += value[i] * (seg_end - seg_start)
    return total


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False),
            st.integers(0, 10_000),
        ),
        min_size=1,
        max_size=60,
    ),
    tail=st.floats(1e-3, 1e6, allow_nan=False, allow_infinity=False),
    n_buckets=st.integers(1, 50),
)
def test_resample_preserves_integral_and_range(steps: list[tuple[float, int]], tail: float, n_buckets: int) -> None:
    steps = sorted(steps, key=lambda s: s[0])
    time = np.array([s[0] for s in steps])
    value = np.array([s[1] for s in steps], dtype=float)
    start, end = float(time[0]), float(time[-1]) + tail

    starts, means = time_weighted_resample(time, value, n_buckets, end_time=end)

    width = (end - start) / n_buckets
    assert starts.shape == means.shape == (n_buckets,)
    expected = _step_integral(time, value, start, end)
    assert math.isclose(float(np.sum(means * width)), expected, rel_tol=1e-9, abs_tol=1e-6 * (end - start))
    # A time-weighted average never leaves the range of the values it averages.
    assert np.all(means >= value.min() - 1e-6) and np.all(means <= value.max() + 1e-6)


def test_quantile_points_exact_on_small_input() -> None:
    x, p = quantile_points([5.0, 1.0, 3.0, 2.0, 4.0], 5)
    np.testing.assert_allclose(x, [1, 2, 3, 4, 5])
    np.testing.assert_allclose(p, [0, 0.25, 0.5, 0.75, 1.0])
    values = np.random.default_rng(1).lognormal(size=1000)
    x, p = quantile_points(values, 11)
    np.testing.assert_allclose(x, np.quantile(values, p))


def test_quantile_points_ignores_nan_and_handles_empty() -> None:
    x, _ = quantile_points([np.nan, 2.0, np.inf, 1.0], 3)
    np.testing.assert_allclose(x, [1.0, 1.5, 2.0])
    x, p = quantile_points([np.nan], 10)
    assert x.size == 0 and p.size == 0
    with pytest.raises(ValueError):
        quantile_points([1.0], 1)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.one_of(st.floats(-1e12, 1e12), st.just(float("nan"))), max_size=300),
    n=st.integers(2, 600),
)
def test_quantile_points_monotonic(values: list[float], n: int) -> None:
    x, p = quantile_points(values, n)
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        assert x.size == 0
        return
    assert x.size == p.size == n
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(p) > 0)
    assert x[0] == min(finite) and x[-1] == max(finite)
    assert p[0] == 0.0 and p[-1] == 1.0
