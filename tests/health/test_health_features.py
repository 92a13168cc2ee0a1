"""Window instances: exact labels, who is a candidate, tabular aggregates against a naive computation."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.errors import HealthError
from gpufleet.health.features import (
    FeatureConfig,
    build_samples,
    candidate_instances,
    feature_names,
    labels,
    tabular_from_sequence,
    training_samples,
)
from gpufleet.health.fleet_arrays import CHANNELS, COUNTERS, FleetArrays

EVENTS = {*COUNTERS, "hw_throttle_h", "sw_thermal_h", "xid63", "xid92", "xid94", "xid_benign", "xid_other", "xid_hard"}


def _arrays(
    gpus: int,
    n_bins: int,
    failures: list[tuple[int, int]],
    bin_h: int = 6,
    seed: int = 0,
    down: list[tuple[int, int]] = (),
) -> FleetArrays:
    """Hand-made fleet arrays: random bins, the given (gpu, hour) failures, GPUs down in the given (gpu, bin)."""
    rng = np.random.default_rng(seed)
    bins = rng.random((gpus, n_bins, len(CHANNELS))).astype(np.float32)
    alive_end = np.ones((gpus, n_bins), dtype=bool)
    for g, b in down:
        alive_end[g, b] = False
    f = np.array(failures, dtype=np.int64).reshape(-1, 2)
    return FleetArrays(
        bins=bins,
        bin_h=bin_h,
        hours=n_bins * bin_h,
        start=datetime(2024, 1, 1, tzinfo=UTC),
        node=np.arange(gpus) // 8,
        failure_gpu=f[:, 0],
        failure_hour=f[:, 1],
        failure_xid=np.full(len(f), 79),
        alive_end=alive_end,
    )


# -------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kw", [{"window_h": 0}, {"window_h": 100}, {"recent_h": -6}, {"horizon_h": 50}, {"window_h": 24, "recent_h": 48}]
)
def test_validate_rejects(kw):
    with pytest.raises(HealthError):
        FeatureConfig(**kw).validate(6)


def test_validate_accepts_multiples():
    FeatureConfig(window_h=72, recent_h=72, horizon_h=6).validate(6)
    with pytest.raises(HealthError, match="multiple of the 12-hour bin"):
        FeatureConfig(window_h=72, recent_h=18, horizon_h=24).validate(12)


# -------------------------------------------------------------------------------------------- labels
def test_labels_by_hand():
    # GPU 0 fails at 100 and 130; GPU 2 at 40. Horizon 48.
    a = _arrays(3, 40, [(2, 40), (0, 130), (0, 100)])
    gpu = np.array([0, 0, 0, 0, 0, 0, 1, 2, 2, 2])
    hour = np.array([52, 53, 100, 101, 130, 131, 60, 0, 40, 41])
    y, lead = labels(a, gpu, hour, 48)
    assert y.tolist() == [0, 1, 1, 1, 1, 0, 0, 1, 1, 0]
    want = [np.nan, 47, 0, 29, 0, np.nan, np.nan, 40, 0, np.nan]
    np.testing.assert_array_equal(lead, np.array(want, dtype=np.float32))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 239)), min_size=1, max_size=8, unique=True),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 240)), min_size=1, max_size=30),
    st.sampled_from([6, 24, 48]),
)
def test_labels_match_naive(failures, queries, horizon):
    a = _arrays(4, 40, failures)
    gpu = np.array([q[0] for q in queries])
    hour = np.array([q[1] for q in queries])
    y, lead = labels(a, gpu, hour, horizon)
    for i, (g, t) in enumerate(queries):
        later = sorted(f for fg, f in failures if fg == g and f >= t)
        nxt = later[0] if later else None  # only the GPU's next failure counts
        positive = nxt is not None and nxt < t + horizon
        assert y[i] == int(positive)
        if positive:
            assert lead[i] == nxt - t
        else:
            assert np.isnan(lead[i])


def test_labels_without_any_failure_are_all_negative():
    a = _arrays(2, 10, [])
    y, lead = labels(a, np.array([0, 1]), np.array([12, 30]), 24)
    assert y.tolist() == [0, 0] and np.isnan(lead).all()


# -------------------------------------------------------------------------------------------- candidates
def test_candidates_skip_down_gpus_and_need_a_window():
    cfg = FeatureConfig(window_h=24, recent_h=12, horizon_h=12)
    a = _arrays(3, 20, [], down=[(1, 5), (2, 9), (0, 19)])
    gpu, hour = candidate_instances(a, cfg, 0, 10_000)
    got = set(zip(gpu.tolist(), hour.tolist(), strict=True))
    # instances run to the end of the telemetry inclusive: the one at hour 120 reads bins 0..19 only
    want = {(g, t) for t in range(24, 121, 6) for g in range(3) if a.alive_end[g, t // 6 - 1]}
    assert got == want
    assert (1, 36) not in got and (2, 60) not in got and (1, 42) in got
    # thinning to one round a day, and a start that is not on the grid
    gpu, hour = candidate_instances(a, cfg, 30, 100, every_h=24)
    assert sorted(set(hour.tolist())) == [48, 72, 96]
    assert len(gpu) == 9
    with pytest.raises(HealthError, match="not a multiple"):
        candidate_instances(a, cfg, 0, 100, every_h=9)


# -------------------------------------------------------------------------------------------- tabular
def _naive_tabular(seq: np.ndarray, channels: tuple[str, ...], rb: int) -> np.ndarray:
    n, wb, _ = seq.shape
    alive_norm = 6.0  # bin_h: alive hours per bin at most
    rows = []
    for i in range(n):
        row = []
        for c, ch in enumerate(channels):
            v = seq[i, :, c].astype(np.float64)
            ok = ~np.isnan(v)
            z = np.where(ok, v, 0.0)
            peak = v[ok].max() if ok.any() else np.nan
            if ch == "alive_h":
                row.append(z.sum() / (wb * alive_norm))
            elif ch in EVENTS:
                nz = [k for k in range(wb) if z[wb - 1 - k] > 0]
                row += [
                    z.sum(),
                    z[-rb:].sum(),
                    z[-1],
                    peak,
                    z[wb // 2 :].sum() - z[: wb // 2].sum(),
                    nz[0] if nz else wb,
                ]
            else:
                mean = v[ok].mean() if ok.any() else np.nan
                recent = v[-rb:][ok[-rb:]]
                mean_r = recent.mean() if len(recent) else np.nan
                std = v[ok].std() if ok.any() else np.nan
                row += [mean, mean_r, v[-1], peak, std, mean_r - mean]
        rows.append(row)
    return np.array(rows)


CH = ("temp", "sbe", "xid_hard", "power", "alive_h", "sbe_level")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(2, 9), st.data())
def test_tabular_matches_naive(n, wb, data):
    rb = data.draw(st.integers(1, wb))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    seq = np.round(rng.uniform(-10, 10, (n, wb, len(CH))), 2).astype(np.float32)
    for name in ("sbe", "xid_hard", "alive_h"):  # counts are non-negative, often zero
        c = CH.index(name)
        seq[:, :, c] = np.where(rng.random((n, wb)) < 0.5, 0, np.abs(seq[:, :, c]))
    seq[rng.random(seq.shape) < 0.25] = np.nan
    if data.draw(st.booleans()):
        seq[0, :, :] = np.nan  # a GPU that reported nothing in its window
    got = tabular_from_sequence(seq, CH, rb, 6)
    want = _naive_tabular(seq, CH, rb)
    names = feature_names(CH)
    assert got.shape == want.shape == (n, len(names))
    for j, name in enumerate(names):
        if name.endswith("_std_w"):  # compare variances: float32 sums of squares
            np.testing.assert_allclose(got[:, j] ** 2, want[:, j] ** 2, atol=2e-3, err_msg=name)
        else:
            np.testing.assert_allclose(got[:, j], want[:, j], rtol=1e-5, atol=1e-4, err_msg=name)


def test_feature_names_follow_kinds():
    names = feature_names(("temp", "xid63", "alive_h"))
    assert names == [
        "temp_mean_w",
        "temp_mean_recent",
        "temp_last",
        "temp_max",
        "temp_std_w",
        "temp_trend",
        "xid63_sum_w",
        "xid63_sum_recent",
        "xid63_last",
        "xid63_max",
        "xid63_trend",
        "xid63_bins_since",
        "alive_h_frac_w",
    ]


def test_gauge_std_is_accurate_far_from_zero():
    rng = np.random.default_rng(0)
    seq = (1980.0 + rng.normal(0, 1.0, (1, 28, 1))).astype(np.float32)
    got = tabular_from_sequence(seq, ("sm_clock",), 4, 6)[0, feature_names(("sm_clock",)).index("sm_clock_std_w")]
    assert got == pytest.approx(np.std(seq[0, :, 0].astype(np.float64)), rel=0.05)


def test_features_of_an_instance_do_not_depend_on_the_batch():
    ch = ("temp", "alive_h")
    flaky = np.array([[[60.0, 3.0]] * 4], dtype=np.float32)  # reported 3 h of every 6-h bin
    healthy = np.array([[[60.0, 6.0]] * 4], dtype=np.float32)
    alone = tabular_from_sequence(flaky, ch, 2, 6)[0]
    together = tabular_from_sequence(np.concatenate([flaky, healthy]), ch, 2, 6)[0]
    np.testing.assert_array_equal(alone, together)


# -------------------------------------------------------------------------------------------- samples
def test_build_samples_gathers_windows_and_labels():
    cfg = FeatureConfig(window_h=36, recent_h=12, horizon_h=24)
    a = _arrays(4, 30, [(1, 70), (3, 150)], seed=3)
    gpu, hour = candidate_instances(a, cfg, 0, 10_000)
    s = build_samples(a, gpu, hour, cfg, block=7)
    assert len(s) == len(gpu) and s.sequence.shape == (len(gpu), 6, len(CHANNELS))
    for i in (0, 5, len(gpu) - 1):
        b = hour[i] // 6
        np.testing.assert_array_equal(s.sequence[i], a.bins[gpu[i], b - 6 : b])
    np.testing.assert_array_equal(s.tabular, tabular_from_sequence(s.sequence, CHANNELS, 2, 6))
    y, lead = labels(a, gpu, hour, 24)
    np.testing.assert_array_equal(s.y, y)
    np.testing.assert_array_equal(s.lead_h, lead)
    assert s.feature_names == feature_names(CHANNELS) and s.channel_names == list(CHANNELS)
    assert set(zip(s.gpu[s.y == 1].tolist(), s.time[s.y == 1].tolist(), strict=True)) == {
        (1, 48),
        (1, 54),
        (1, 60),
        (1, 66),
        (3, 132),
        (3, 138),
        (3, 144),
        (3, 150),
    }
    unlabelled = build_samples(a, gpu, hour, cfg, with_labels=False)
    assert unlabelled.y is None and unlabelled.lead_h is None


@pytest.mark.parametrize("end_h", [96, 140, 174])
def test_training_samples_keep_positives_and_respect_end(end_h):
    cfg = FeatureConfig(window_h=24, recent_h=12, horizon_h=24)
    failures = [(g, h) for g in range(0, 40, 3) for h in (50 + g, 100 + 2 * g)]
    a = _arrays(40, 30, failures, seed=1, down=[(5, 10), (6, 15)])
    s = training_samples(a, cfg, 30, end_h, negative_rate=0.2, seed=7)
    # every instance's label window [t, t + horizon) closes by end_h, and t is on or after start
    assert np.all(s.time + cfg.horizon_h <= end_h) and np.all(s.time >= 30)
    # every positive whose label is known by end_h is kept
    positives = set()
    for g, f in failures:
        for t in range(30, end_h - cfg.horizon_h, 6):  # candidates end before end_h - horizon
            if t <= f < t + cfg.horizon_h and a.alive_end[g, t // 6 - 1] and t + cfg.horizon_h <= end_h:
                nxt = min(ff for gg, ff in failures if gg == g and ff >= t)
                if nxt == f:
                    positives.add((g, t))
    got = set(zip(s.gpu[s.y == 1].tolist(), s.time[s.y == 1].tolist(), strict=True))
    assert got == positives and len(positives) > 0
    # negatives are a sample at about the requested rate
    gpu, hour = candidate_instances(a, cfg, 30, end_h - cfg.horizon_h)
    n_neg = int((labels(a, gpu, hour, 24)[0] == 0).sum())
    kept = int((s.y == 0).sum())
    assert abs(kept - 0.2 * n_neg) <= 5 * np.sqrt(n_neg * 0.2 * 0.8) + 1
