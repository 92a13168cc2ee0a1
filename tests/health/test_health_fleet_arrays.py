"""Binned fleet arrays from a hand-built canonical frame: every channel's bin value derived by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gpufleet.errors import HealthError
from gpufleet.health.fleet_arrays import (
    CHANNELS,
    COUNTERS,
    GAUGES,
    REASONS,
    XID,
    _bin_reduce,
    _increments,
    _increments_with_gaps,
    _node_relative,
    build_arrays,
)

START = datetime(2024, 1, 1, tzinfo=UTC)
G, H, BIN = 16, 48, 6
NB = H // BIN
FIELDS = [*GAUGES.values(), *COUNTERS.values()]


def _frame() -> tuple[pl.DataFrame, dict[str, np.ndarray]]:
    """16 GPUs in 2 nodes, 48 hours. Values are (gpus, hours) arrays; NaN is a null; ``absent`` rows are dropped.

    - temp: 50 + gpu%8 (+10 on node 1), +6 in the last hour of each bin; GPU 3 null at hours 12-13
    - sbe of GPU 2: +1 an hour, reset to 0 at hour 20 then +2 an hour, null (gap) at hours 30-33
    - pcie of GPU 6: +1 an hour; all fields null at hours 24-35 (under repair), then restarts at 1
    - GPU 5: no rows at all at hours 12-17
    - reasons of GPU 4 in bin 0: 0x8, 0x40, 0x80, 0x20, 0x28, 0x5
    - XIDs: GPU 7 63, 92, 94, 13, 79, 999 at hours 6-11 and 48 at hour 40; GPU 1 95 at hour 30
    - thermal violation of GPU 0: +2**30 ns an hour
    """
    hours = np.arange(H)
    gpu = np.arange(G)
    v: dict[str, np.ndarray] = {c: np.zeros((G, H)) for c in FIELDS}
    base = 50.0 + (gpu % 8) + 10.0 * (gpu // 8)
    v["DCGM_FI_DEV_GPU_TEMP"] = base[:, None] + np.where(hours % 6 == 5, 6.0, 0.0)[None, :]
    v["DCGM_FI_DEV_GPU_TEMP"][3, 12:14] = np.nan
    v["DCGM_FI_DEV_POWER_USAGE"] = 100.0 + hours[None, :] + gpu[:, None]
    sbe = np.where(hours < 20, hours, 2.0 * (hours - 20)).astype(float)
    sbe[30:34] = np.nan
    v["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"][2] = sbe
    pcie = np.where(hours < 24, hours, hours - 35).astype(float)
    v["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"][6] = pcie
    v["DCGM_FI_DEV_THERMAL_VIOLATION"][0] = hours * 2.0**30
    for c in FIELDS:
        v[c][6, 24:36] = np.nan
    reasons = np.zeros((G, H), dtype=np.int64)
    reasons[4, :6] = [0x8, 0x40, 0x80, 0x20, 0x28, 0x5]
    codes = np.zeros((G, H), dtype=np.int64)
    codes[7, 6:12] = [63, 92, 94, 13, 79, 999]
    codes[7, 40] = 48
    codes[1, 30] = 95
    absent = np.zeros((G, H), dtype=bool)
    absent[5, 12:18] = True
    keep = ~absent.ravel()
    data = {
        "gpu": pl.Series(np.repeat(gpu, H)[keep], dtype=pl.UInt32),
        "node": pl.Series(np.repeat(gpu // 8, H)[keep], dtype=pl.UInt32),
        "time": pl.Series([START + timedelta(hours=int(h)) for h in np.tile(hours, G)[keep]]).cast(
            pl.Datetime("ms", "UTC")
        ),
    }
    for c in FIELDS:
        if c != GAUGES["mem_temp"]:  # one gauge the exporter does not report
            data[c] = pl.Series(c, v[c].ravel()[keep], dtype=pl.Float32, nan_to_null=True)
    codes_null = np.isnan(v["DCGM_FI_DEV_GPU_TEMP"]) & np.isnan(v["DCGM_FI_DEV_POWER_USAGE"])
    for name, arr in ((REASONS, reasons), (XID, codes)):
        null = pl.Series(codes_null.ravel()[keep])
        data[name] = pl.select(pl.when(null).then(None).otherwise(pl.Series(arr.ravel()[keep]))).to_series()
    v["_absent"] = absent
    return pl.DataFrame(data), v


@pytest.fixture(scope="module")
def built():
    frame, v = _frame()
    return build_arrays(frame, bin_h=BIN), v, frame


def _ch(arrays, name):
    return arrays.bins[:, :, arrays.channel(name)]


def test_shape_and_grid(built):
    a, _, _ = built
    assert a.bins.shape == (G, NB, len(CHANNELS)) and a.bins.dtype == np.float32
    assert (a.gpus, a.n_bins, a.hours, a.bin_h, a.start) == (G, NB, H, BIN, START)
    assert a.node.tolist() == [0] * 8 + [1] * 8


def test_counter_increments_with_reset_and_gap(built):
    a, _, _ = built
    sbe = _ch(a, "sbe")
    # hours 1-19 +1, hour 20 drops to 0 (restart: increment 0), then +2; gap 30-33 carried, hour 34 catches up 10
    assert sbe[2].tolist() == [5, 6, 6, 1 + 1 + 0 + 2 + 2 + 2, 12, 0 + 10 + 2, 12, 12]
    assert _ch(a, "sbe_level")[2].tolist() == [5, 11, 17, 6, 18, 30, 42, 54]
    assert np.all(sbe[[0, 1, 3, 4, 7, 8, 15]] == 0)
    # GPU 6 is under repair in bins 4 and 5 (no data: NaN) and restarts at 1 at hour 36
    pcie = _ch(a, "pcie_replay")[6]
    assert pcie[:4].tolist() == [5, 6, 6, 6] and np.isnan(pcie[4:6]).all() and pcie[6:].tolist() == [6, 6]
    # violation counters are nanoseconds, binned as seconds
    viol = _ch(a, "thermal_viol_s")[0]
    np.testing.assert_allclose(viol, [5 * 2**30 / 1e9] + [6 * 2**30 / 1e9] * 7, rtol=1e-5)


def test_gauges_mean_ignoring_nulls_and_max(built):
    a, _, _ = built
    temp, tmax = _ch(a, "temp"), _ch(a, "temp_max")
    base = 50.0 + np.arange(G) % 8 + 10.0 * (np.arange(G) // 8)
    assert temp[0].tolist() == [51.0] * NB  # (5 x 50 + 56) / 6
    assert tmax[0].tolist() == [56.0] * NB
    assert temp[3, 2] == pytest.approx(53 + 6 / 4)  # hours 12-13 null: (3 x 53 + 59) / 4
    assert tmax[3, 2] == 59.0
    assert np.isnan(temp[5, 2]) and np.isnan(temp[6, 4]) and np.isnan(temp[6, 5])
    ok = np.ones((G, NB), dtype=bool)
    ok[3, 2] = ok[5, 2] = ok[6, 4] = ok[6, 5] = False
    np.testing.assert_allclose(temp[ok], (base[:, None] + 1.0).repeat(NB, axis=1)[ok])
    # power is 100 + hour + gpu: the bin mean is at the bin's middle hour
    np.testing.assert_allclose(_ch(a, "power")[8], 100 + 8 + np.arange(NB) * 6 + 2.5)
    # a gauge absent from the frame is NaN
    assert np.isnan(_ch(a, "mem_temp")).all()


def test_temp_vs_node_median(built):
    a, _, _ = built
    rel = _ch(a, "temp_vs_node")
    # node 0, bin 0: means 51..58, median 54.5; node 1: 61..68, median 64.5
    np.testing.assert_allclose(rel[:, 0], np.tile(np.arange(8) - 3.5, 2))
    # node 0, bin 2: GPU 5 missing, GPU 3 at 54.5 -> {51, 52, 53, 54.5, 55, 57, 58}: median 54.5
    assert rel[0, 2] == pytest.approx(-3.5) and rel[3, 2] == pytest.approx(0.0) and rel[7, 2] == pytest.approx(3.5)
    assert np.isnan(rel[5, 2])
    # node 0, bin 4: GPU 6 down -> {51, 52, 53, 54, 55, 56, 58}: median 54
    assert rel[0, 4] == pytest.approx(-3.0) and rel[7, 4] == pytest.approx(4.0)


def test_throttle_hours(built):
    a, _, _ = built
    assert _ch(a, "hw_throttle_h")[4].tolist() == [4, 0, 0, 0, 0, 0, 0, 0]  # 0x8, 0x40, 0x80, 0x28
    assert _ch(a, "sw_thermal_h")[4].tolist() == [2, 0, 0, 0, 0, 0, 0, 0]  # 0x20, 0x28
    assert np.nansum(_ch(a, "hw_throttle_h")) == 4 and np.nansum(_ch(a, "sw_thermal_h")) == 2


def test_xid_classes_and_failures(built):
    a, _, _ = built
    want = {"xid63": 1, "xid92": 1, "xid94": 1, "xid_benign": 1, "xid_hard": 1, "xid_other": 1}
    for name, count in want.items():
        col = _ch(a, name)
        assert col[7, 1] == count, name
        assert np.nansum(col) == count + (name == "xid_hard") * 2, name  # hard also at GPU 7 h40, GPU 1 h30
    assert _ch(a, "xid_hard")[7, 6] == 1 and _ch(a, "xid_hard")[1, 5] == 1
    assert a.failure_gpu.tolist() == [1, 7, 7]
    assert a.failure_hour.tolist() == [30, 10, 40]
    assert a.failure_xid.tolist() == [95, 79, 48]


def test_until_and_first_gpus_keep_their_failures(built):
    a, _, _ = built
    early = a.until(35)  # whole bins: 5 bins, 30 h
    assert (early.hours, early.n_bins, early.gpus) == (30, 5, G)
    np.testing.assert_array_equal(early.bins, a.bins[:, :5])
    assert early.failure_gpu.tolist() == [7] and early.failure_hour.tolist() == [10]  # h30 and h40 are later
    few = a.first_gpus(4)
    assert (few.gpus, few.n_bins) == (4, NB) and few.node.tolist() == [0] * 4
    assert few.failure_gpu.tolist() == [1] and few.failure_xid.tolist() == [95]  # GPU 7's two are dropped


def test_alive_hours_and_alive_end(built):
    a, _, _ = built
    alive = _ch(a, "alive_h")
    want = np.full((G, NB), 6.0)
    want[5, 2] = 0  # no rows
    want[6, 4] = want[6, 5] = 0  # rows with every field null
    assert np.array_equal(alive, want)
    assert np.array_equal(a.alive_end, want > 0)
    # a bin without data is NaN in every other channel
    others = [i for i, c in enumerate(CHANNELS) if c != "alive_h"]
    assert np.isnan(a.bins[5, 2, others]).all() and np.isnan(a.bins[6, 4, others]).all()


def test_parquet_source_equals_frame(built, tmp_path):
    a, _, frame = built
    path = tmp_path / "t.parquet"
    frame.write_parquet(path)
    b = build_arrays(path, bin_h=BIN)
    np.testing.assert_array_equal(a.bins, b.bins)
    assert np.array_equal(a.failure_hour, b.failure_hour)


def test_errors(tmp_path):
    with pytest.raises(HealthError, match="no such telemetry file"):
        build_arrays(tmp_path / "missing.parquet")
    frame, _ = _frame()
    with pytest.raises(HealthError, match="shorter than one"):
        build_arrays(frame.filter(pl.col("time") < START + timedelta(hours=4)), bin_h=6)
    with pytest.raises(HealthError, match="'time'"):
        build_arrays(frame.drop("time"))
    with pytest.raises(HealthError, match="empty"):
        build_arrays(frame.clear())


# ------------------------------------------------------------------------------------------ helpers, naive
def _naive_increments(row: np.ndarray) -> np.ndarray:
    """The first reading is the baseline (increment 0); then differences, a drop being a restart from 0."""
    out, last = np.zeros(len(row)), None
    for i, x in enumerate(row):
        if np.isnan(x):
            continue
        out[i] = 0.0 if last is None else (x - last if x >= last else x)
        last = x
    return out


levels = hnp.arrays(
    np.float32,
    st.tuples(st.integers(1, 4), st.integers(1, 30)),
    elements=st.floats(0, 1e4, width=32).map(lambda x: float(np.float32(round(x)))),
)


@settings(max_examples=60, deadline=None)
@given(levels)
def test_increments_equal_with_gaps_on_gap_free_input(level):
    fast = _increments(level.copy())
    np.testing.assert_array_equal(fast, _increments_with_gaps(level.copy()))
    for r in range(level.shape[0]):
        np.testing.assert_allclose(fast[r], _naive_increments(level[r]))


@settings(max_examples=60, deadline=None)
@given(levels, st.data())
def test_increments_with_gaps_match_naive(level, data):
    mask = data.draw(hnp.arrays(bool, level.shape))
    level = np.where(mask, np.float32(np.nan), level).astype(np.float32)
    got = _increments(level.copy())
    for r in range(level.shape[0]):
        np.testing.assert_allclose(got[r], _naive_increments(level[r]))


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 3), st.integers(1, 25)),
        elements=st.one_of(st.just(np.nan), st.floats(-100, 100)),
    ),
    st.integers(1, 6),
)
def test_bin_reduce_matches_naive(x, bin_h):
    nb = x.shape[1] // bin_h
    for how in ("mean", "max", "sum", "last"):
        got = _bin_reduce(x, bin_h, how)
        assert got.shape == (x.shape[0], nb)
        for r in range(x.shape[0]):
            for b in range(nb):
                v = x[r, b * bin_h : (b + 1) * bin_h]
                vals = v[~np.isnan(v)]
                want = {
                    "sum": vals.sum(),
                    "mean": vals.mean() if len(vals) else np.nan,
                    "max": vals.max() if len(vals) else np.nan,
                    "last": vals[-1] if len(vals) else np.nan,
                }[how]
                if np.isnan(want):
                    assert np.isnan(got[r, b]), (how, r, b)
                else:
                    assert got[r, b] == pytest.approx(want, rel=1e-5, abs=1e-4), (how, r, b)


@pytest.mark.parametrize("node", [np.array([3, 0, 3, 0, 3, 0]), np.array([7, 7, 2, 7, 2, 5])])
def test_node_relative_matches_naive(node):
    rng = np.random.default_rng(4)
    temp = rng.normal(60, 5, (len(node), 5)).astype(np.float32)
    temp[0, 1] = np.nan
    temp[:, 4] = np.nan
    got = _node_relative(temp, node)
    for g in range(len(node)):
        peers = temp[node == node[g]]
        for b in range(temp.shape[1]):
            col = peers[:, b][~np.isnan(peers[:, b])]
            if np.isnan(temp[g, b]):
                assert np.isnan(got[g, b])
            else:
                assert got[g, b] == pytest.approx(
                    temp[g, b] - np.sort(col)[len(col) // 2]
                    if len(col) % 2
                    else temp[g, b] - (np.sort(col)[len(col) // 2 - 1] + np.sort(col)[len(col) // 2]) / 2,
                    abs=1e-4,
                )


def test_pcie_vs_node_is_replays_above_the_node_median(built):
    a, _, _ = built
    rel = _ch(a, "pcie_vs_node")
    # GPU 6 alone replays 6 an hour-bin in bins 0-3 (its node's other GPUs replay nothing): all of it stands out
    np.testing.assert_allclose(rel[6, 1:4], _ch(a, "pcie_replay")[6, 1:4])
    assert (rel[6, 1:4] > 0).all()
    # every other GPU of that node sits at the median
    assert np.nanmax(np.abs(rel[[0, 1, 2, 3, 4, 7], :4])) == 0.0
