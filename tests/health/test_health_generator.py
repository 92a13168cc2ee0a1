"""The synthetic fleet: canonical schema, ground truth consistent with the telemetry, published failure rate."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import polars as pl
import pytest

from gpufleet.health import facts, xid
from gpufleet.health.generator import (
    CODES,
    COUNTERS,
    GAUGES,
    FleetConfig,
    _draw_failures,
    _drift_episodes,
    generate_fleet,
)

METRICS = (*GAUGES, *COUNTERS, *CODES)
CFG = FleetConfig(gpus=96, days=25, seed=5, failure_scale=100)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    path = tmp_path_factory.mktemp("gen") / "fleet.parquet"
    summary = generate_fleet(CFG, path)
    return summary, pl.read_parquet(path), pl.read_parquet(summary.failures_path)


def test_schema_rows_and_order(fleet):
    summary, frame, _ = fleet
    expected = {
        "gpu": pl.UInt32,
        "node": pl.UInt32,
        "time": pl.Datetime("ms", "UTC"),
        **{c: pl.Float32 for c in (*GAUGES, *COUNTERS)},
        **{c: pl.Int64 for c in CODES},
    }
    assert dict(frame.schema) == expected
    assert frame.height == CFG.gpus * CFG.hours == summary.rows
    assert summary.path.name == "fleet.parquet" and summary.failures_path.name == "fleet.failures.parquet"
    gpu = frame["gpu"].to_numpy()
    assert np.array_equal(gpu, np.repeat(np.arange(CFG.gpus), CFG.hours))
    assert np.array_equal(frame["node"].to_numpy(), gpu // CFG.gpus_per_node)
    first = frame.filter(pl.col("gpu") == 0)["time"].to_list()
    assert first == [CFG.start + timedelta(hours=h) for h in range(CFG.hours)]
    # every GPU has the same hourly clock
    assert frame["time"].n_unique() == CFG.hours


def test_truth_matches_hard_xids_in_telemetry(fleet):
    summary, frame, truth = fleet
    assert truth.height == summary.failures > 0
    assert sum(summary.failures_by_kind.values()) == truth.height
    assert truth["node"].to_list() == [g // CFG.gpus_per_node for g in truth["gpu"].to_list()]
    assert truth["time"].to_list() == [CFG.start + timedelta(hours=h) for h in truth["hour"].to_list()]
    assert truth["hour"].max() < CFG.hours
    hard = frame.with_columns(hour=pl.int_range(pl.len()).over("gpu")).filter(
        pl.col("DCGM_FI_DEV_XID_ERRORS").is_in(sorted(xid.HARD_XIDS))
    )
    seen = set(
        zip(hard["gpu"].to_list(), hard["hour"].to_list(), hard["DCGM_FI_DEV_XID_ERRORS"].to_list(), strict=True)
    )
    want = set(zip(truth["gpu"].to_list(), truth["hour"].to_list(), truth["xid"].to_list(), strict=True))
    assert seen == want
    kinds = {k.name: k for k in facts.FAILURE_KINDS}
    for kind, code in zip(truth["kind"].to_list(), truth["xid"].to_list(), strict=True):
        assert code in kinds[kind].xids


def test_null_exactly_while_under_repair(fleet):
    _, frame, truth = fleet
    expected = np.zeros((CFG.gpus, CFG.hours), dtype=bool)
    for g, f, r in zip(truth["gpu"].to_list(), truth["hour"].to_list(), truth["repair_h"].to_list(), strict=True):
        expected[g, f + 1 : f + 1 + r] = True
    for col in METRICS:
        null = frame[col].is_null().to_numpy().reshape(CFG.gpus, CFG.hours)
        assert np.array_equal(null, expected), col
    # the failure hour itself reports, with the hard XID
    xids = frame["DCGM_FI_DEV_XID_ERRORS"].to_numpy().reshape(CFG.gpus, CFG.hours)
    for g, f, code in zip(truth["gpu"].to_list(), truth["hour"].to_list(), truth["xid"].to_list(), strict=True):
        assert xids[g, f] == code


def test_counters_only_drop_right_after_repair(fleet):
    _, frame, truth = fleet
    back = {
        (g, f + 1 + r)
        for g, f, r in zip(truth["gpu"].to_list(), truth["hour"].to_list(), truth["repair_h"].to_list(), strict=True)
    }
    for col in COUNTERS:
        level = frame[col].to_numpy().reshape(CFG.gpus, CFG.hours)
        assert np.nanmin(level) >= 0, col
        for g in range(CFG.gpus):
            hours = np.flatnonzero(~np.isnan(level[g]))
            values = level[g, hours]
            for i in np.flatnonzero(np.diff(values) < 0) + 1:
                assert (g, int(hours[i])) in back, (col, g, int(hours[i]))
                assert hours[i] - hours[i - 1] > 1  # a drop only follows a gap (the repair)


def test_same_seed_same_file_other_seed_differs(tmp_path, fleet):
    _, frame, truth = fleet
    again = generate_fleet(CFG, tmp_path / "again.parquet")
    assert pl.read_parquet(again.path).equals(frame)
    assert pl.read_parquet(again.failures_path).equals(truth)
    other = generate_fleet(
        FleetConfig(gpus=CFG.gpus, days=CFG.days, seed=CFG.seed + 1, failure_scale=CFG.failure_scale),
        tmp_path / "other.parquet",
    )
    other_frame = pl.read_parquet(other.path)
    assert other_frame.shape == frame.shape
    assert not other_frame.equals(frame)
    assert not np.array_equal(other_frame["DCGM_FI_DEV_GPU_TEMP"].to_numpy(), frame["DCGM_FI_DEV_GPU_TEMP"].to_numpy())


def test_published_failure_rate_and_mix():
    cfg = FleetConfig(gpus=200_000, days=120, seed=3)
    rng = np.random.default_rng(11)
    weak = rng.random(cfg.gpus) < cfg.weak_batch_share
    drawn = _draw_failures(cfg, rng, weak)
    per_gpu_hour = facts.LLAMA3_INTERRUPTIONS / (facts.LLAMA3_GPUS * facts.LLAMA3_DAYS * 24)
    total_share = sum(k.share for k in facts.FAILURE_KINDS)
    expected = per_gpu_hour * total_share * cfg.gpus * cfg.hours  # about 6,500
    # a few are dropped because they fall inside an earlier failure's repair on the same GPU
    dropped_allowance = 0.01 * expected
    assert expected - 4 * math.sqrt(expected) - dropped_allowance <= drawn.height <= expected + 4 * math.sqrt(expected)
    counts = dict(drawn.group_by("kind").len().iter_rows())
    for k in facts.FAILURE_KINDS:
        p = k.share / total_share
        n = counts.get(k.name, 0)
        assert abs(n - p * drawn.height) <= 4 * math.sqrt(drawn.height * p * (1 - p)) + 2, k.name
        assert set(drawn.filter(pl.col("kind") == k.name)["xid"].unique().to_list()) <= set(k.xids)
        # precursor share per kind
        with_pre = drawn.filter(pl.col("kind") == k.name)["precursor"].sum()
        prob = k.precursor_prob
        if k.name == "gsp":  # after the driver roll-out GSP failures are more frequent and mostly announced
            up = facts.DRIVER_UPGRADE_DAY * 24
            w_after = facts.GSP_AFTER_UPGRADE_FACTOR * (cfg.hours - up)
            prob = (up * k.precursor_prob + w_after * facts.GSP_PRECURSOR_AFTER) / (up + w_after)
            gsp_hours = drawn.filter(pl.col("kind") == "gsp")["hour"].to_numpy()
            share_after = w_after / (up + w_after)
            assert abs((gsp_hours >= up).mean() - share_after) < 4 * math.sqrt(share_after * (1 - share_after) / n)
        assert abs(with_pre - prob * n) <= 4 * math.sqrt(n * prob * (1 - prob)) + 1, k.name
    # no two kept failures of one GPU overlap a repair window
    g, h, r = (drawn[c].to_numpy() for c in ("gpu", "hour", "repair_h"))
    same = g[1:] == g[:-1]
    assert np.all(h[1:][same] > (h[:-1] + r[:-1])[same])
    assert np.all((h >= 0) & (h < cfg.hours))
    # the weak batch takes more HBM failures per GPU than the rest
    hbm = drawn.filter(pl.col("kind") == "hbm")["gpu"].to_numpy()
    assert weak[hbm].mean() > cfg.weak_batch_share * 1.5


def test_hbm_precursor_raises_single_bit_errors_before_failure(tmp_path):
    cfg = FleetConfig(gpus=320, days=30, seed=2, failure_scale=100)
    summary = generate_fleet(cfg, tmp_path / "hbm.parquet")
    frame = pl.read_parquet(summary.path, columns=["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"])
    sbe = frame["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"].to_numpy().reshape(cfg.gpus, cfg.hours)
    truth = pl.read_parquet(summary.failures_path)
    # first failure of each GPU only: its counter has never been reset before it
    first = truth.group_by("gpu").agg(pl.all().sort_by("hour").first())
    hbm = first.filter((pl.col("kind") == "hbm") & pl.col("precursor") & (pl.col("hour") >= 144))
    assert hbm.height >= 10
    before, earlier = [], []
    for g, f in zip(hbm["gpu"].to_list(), hbm["hour"].to_list(), strict=True):
        level = sbe[g]
        before.append((level[f - 1] - level[f - 49]) / 48)  # errors per hour in the 48 h before the failure
        earlier.append(level[f - 49] / (f - 48))  # errors per hour over the GPU's history before that
    assert np.mean(before) > 3 * np.mean(earlier)
    assert np.median(np.array(before) - np.array(earlier)) > 0


def test_drift_look_alikes_appear_where_and_when_the_fleet_drifts():
    cfg = FleetConfig(gpus=40_000, days=120, seed=5)
    rng = np.random.default_rng(7)
    weak = rng.random(cfg.gpus) < cfg.weak_batch_share
    racks = math.ceil(cfg.nodes / cfg.nodes_per_rack)
    bad = rng.random(racks) < facts.MAINTENANCE_RACK_SHARE
    ep = _drift_episodes(cfg, rng, weak, bad)
    assert not ep["true"].any()
    storms = ep.filter(pl.col("signature") == "pcie_storm")
    gpu = storms["gpu"].to_numpy().astype(np.int64)
    node = gpu // cfg.gpus_per_node
    # only after the maintenance, only on the racks it left with loose cables, always a whole node at once
    assert (storms["start"].to_numpy() >= facts.MAINTENANCE_DAY * 24).all()
    assert bad[node // cfg.nodes_per_rack].all()
    per_storm = storms.group_by("start", "end", "intensity").agg(
        pl.col("gpu").count().alias("n"), (pl.col("gpu") // cfg.gpus_per_node).n_unique().alias("nodes")
    )
    assert (per_storm["n"] % cfg.gpus_per_node == 0).all()
    assert (per_storm["nodes"] == per_storm["n"] // cfg.gpus_per_node).all()
    expected = facts.CABLE_STORMS_PER_NODE_DAY * bad.sum() * cfg.nodes_per_rack * (120 - facts.MAINTENANCE_DAY)
    assert abs(per_storm["n"].sum() / cfg.gpus_per_node - expected) < 4 * math.sqrt(expected) + 1
    # ageing leakage: weak GPUs only, about AGING_LEAK_SHARE of them, onsets later and later (hazard ~ t)
    aging = ep.filter(pl.col("signature") == "sbe_aging")
    assert weak[aging["gpu"].to_numpy().astype(np.int64)].all()
    n_weak = int(weak.sum())
    assert abs(aging.height - facts.AGING_LEAK_SHARE * n_weak) < 4 * math.sqrt(facts.AGING_LEAK_SHARE * n_weak)
    start = aging["start"].to_numpy()
    # P(onset in the second half) = 1 - 0.25 = 0.75 for a linearly rising hazard
    assert abs((start >= cfg.hours / 2).mean() - 0.75) < 4 * math.sqrt(0.75 * 0.25 / aging.height)
    # turned off, nothing is drawn
    off = _drift_episodes(FleetConfig(gpus=4_000, storm_scale=0.0, aging_scale=0.0), rng, weak[:4_000], bad)
    assert off.height == 0


def _node_wide_replay_hours(path, cfg: FleetConfig) -> np.ndarray:
    """Hours in which at least 6 of a node's 8 GPUs add more than 3 PCIe replays each."""
    level = pl.read_parquet(path, columns=["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"])["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]
    inc = np.diff(level.to_numpy().reshape(cfg.gpus, cfg.hours), axis=1, prepend=0.0)
    busy = (np.nan_to_num(inc) > 3).reshape(cfg.nodes, cfg.gpus_per_node, -1).sum(axis=1) >= 6
    return np.nonzero(busy)[1]


def test_cable_storms_replay_across_a_whole_node_after_the_maintenance(tmp_path):
    cfg = FleetConfig(gpus=320, days=90, seed=4, storm_scale=50.0, aging_scale=0.0)
    hours = _node_wide_replay_hours(generate_fleet(cfg, tmp_path / "storm.parquet").path, cfg)
    assert len(hours) > 0
    assert hours.min() >= facts.MAINTENANCE_DAY * 24
    calm = FleetConfig(gpus=320, days=90, seed=4, storm_scale=0.0, aging_scale=0.0)
    assert len(_node_wide_replay_hours(generate_fleet(calm, tmp_path / "calm.parquet").path, calm)) == 0
