"""Evaluation: the metrics table, honest time splits, and an oracle that must score perfectly."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

import numpy as np
import polars as pl
import pytest

import gpufleet.health.evaluate as ev
from gpufleet.errors import HealthError
from gpufleet.health.evaluate import EvalConfig, evaluate
from gpufleet.health.features import FeatureConfig, candidate_instances
from gpufleet.health.fleet_arrays import CHANNELS, FleetArrays, build_arrays
from gpufleet.health.generator import FleetConfig, generate_fleet
from gpufleet.health.models.base import register_model
from gpufleet.health.samples import Samples

FC = FeatureConfig(window_h=72, recent_h=24, horizon_h=48)
CFG = EvalConfig(features=FC, train_days=14, period_days=7, budget=0.02)
ORACLE, RECORDER = "test_health_eval_oracle", "test_health_eval_recorder"
SPANS: list[tuple[int, int]] = []  # (start_h, end_h) of every training_samples call, in order


@register_model(ORACLE, "knows the labels: -hours to the failure, -inf for healthy instances")
class Oracle:
    name = ORACLE

    def __init__(self, seed: int = 0) -> None:
        pass

    def fit(self, samples: Samples) -> Oracle:
        return self

    def score(self, samples: Samples) -> np.ndarray:
        return np.where(np.isnan(samples.lead_h), -np.inf, -samples.lead_h.astype(np.float64))


@register_model(RECORDER, "records the span it was trained on and every span it scores")
class Recorder:
    name = RECORDER
    #: (training span, first and last scored hour, last training instance's hour), one entry per score call
    log: ClassVar[list[tuple[tuple[int, int] | None, int, int, int]]] = []

    def __init__(self, seed: int = 0) -> None:
        self.span: tuple[int, int] | None = None
        self.last_train_t = -1

    def fit(self, samples: Samples) -> Recorder:
        self.span = SPANS[-1]
        self.last_train_t = int(samples.time.max())
        return self

    def score(self, samples: Samples) -> np.ndarray:
        Recorder.log.append((self.span, int(samples.time.min()), int(samples.time.max()), self.last_train_t))
        return np.zeros(len(samples))


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "fleet.parquet"
    generate_fleet(FleetConfig(gpus=128, days=30, seed=4, failure_scale=80), path)
    return build_arrays(path)


def _fails_within(arrays: FleetArrays, gpu: int, hour: int, horizon: int) -> bool:
    f = arrays.failure_hour[arrays.failure_gpu == gpu]
    return bool(((f >= hour) & (f < hour + horizon)).any())


def test_gbdt_table_and_alerts(arrays):
    res = evaluate(arrays, ["gbdt"], EvalConfig(features=FC, train_days=14, period_days=14, budget=0.02))
    assert res.table.columns == [
        "model",
        "mode",
        "alerts",
        "true_alerts",
        "precision",
        "recall",
        "f1",
        "caught",
        "lead_h_median",
        "lead_h_mean",
    ]
    assert res.table["mode"].to_list() == ["once", "sliding"] and set(res.table["model"]) == {"gbdt"}
    for r in res.table.iter_rows(named=True):
        assert r["alerts"] > 0
        assert r["precision"] == pytest.approx(r["true_alerts"] / r["alerts"])
        assert 0 <= r["recall"] <= 1
        if r["precision"] + r["recall"] > 0:
            assert r["f1"] == pytest.approx(2 * r["precision"] * r["recall"] / (r["precision"] + r["recall"]))
    # every alert's truth is the fleet's: the GPU fails within the horizon
    a = res.alerts
    assert a.columns == ["model", "mode", "gpu", "hour", "score", "true", "lead_h"]
    for g, h, t in zip(a["gpu"].to_list(), a["hour"].to_list(), a["true"].to_list(), strict=True):
        assert t == _fails_within(arrays, g, h, FC.horizon_h)
    # rounds are daily, in the test span, and each alerts at most its budget
    assert (a["hour"] % 24 == 0).all() and a["hour"].min() >= 14 * 24
    _, hour = candidate_instances(arrays, FC, 14 * 24, 10_000, every_h=24)
    per_round = dict(zip(*np.unique(hour, return_counts=True), strict=True))
    for _, h, n in a.group_by("mode", "hour").len().iter_rows():
        assert n <= max(1, round(0.02 * per_round[h]))
    assert res.monthly.columns == ["model", "mode", "month", "alerts", "precision"]
    assert (
        res.monthly.group_by("mode").agg(pl.col("alerts").sum()).sort("mode")["alerts"].to_list()
        == res.table.sort("mode")["alerts"].to_list()
    )
    end_h = arrays.n_bins * arrays.bin_h - FC.horizon_h
    assert res.failures == int(((arrays.failure_hour >= 14 * 24) & (arrays.failure_hour < end_h)).sum()) > 0


def test_time_splits_are_honest(arrays, monkeypatch):
    real = ev.training_samples

    def recording(arr, fc, start_h, end_h, *args, **kwargs):
        SPANS.append((start_h, end_h))
        return real(arr, fc, start_h, end_h, *args, **kwargs)

    monkeypatch.setattr(ev, "training_samples", recording)
    SPANS.clear()
    Recorder.log.clear()
    evaluate(arrays, [RECORDER], CFG)
    train_h, period_h = 14 * 24, 7 * 24
    end_h = arrays.n_bins * arrays.bin_h - FC.horizon_h
    starts = list(range(train_h, end_h, period_h))
    assert SPANS[0] == (0, train_h)  # train-once ends at train_days
    assert set(SPANS) == {(0, train_h)} | {(max(0, s - train_h), s) for s in starts}
    assert len(Recorder.log) == 2 * len(starts)  # each period scored once per mode
    for p_start, (span, first, last, last_train_t) in zip(np.repeat(starts, 2), Recorder.log, strict=True):
        assert span[1] <= first  # the fit ended before the period it scores
        assert last_train_t + FC.horizon_h <= span[1] <= p_start <= first  # its labels were known by then
        assert last < min(p_start + period_h, end_h)
    # modes alternate per period: once (always the first window), then sliding (the window just before)
    assert [e[0] for e in Recorder.log[0::2]] == [(0, train_h)] * len(starts)
    assert [e[0] for e in Recorder.log[1::2]] == [(s - train_h, s) for s in starts]


def test_oracle_is_perfectly_precise(arrays):
    res = evaluate(arrays, [ORACLE], CFG)
    for r in res.table.iter_rows(named=True):
        assert r["precision"] == 1.0 and r["true_alerts"] == r["alerts"] > 0
    assert res.alerts["true"].all()


def _hand_arrays() -> FleetArrays:
    """20 GPUs, 30 days; failures in training (h 100, 200), in the test span (300, 500) and just after it (680)."""
    gpus, nb = 20, 120
    failures = np.array([[0, 100], [1, 200], [2, 300], [3, 500], [4, 680]])
    bins = np.random.default_rng(0).random((gpus, nb, len(CHANNELS))).astype(np.float32)
    return FleetArrays(
        bins=bins,
        bin_h=6,
        hours=nb * 6,
        start=datetime(2024, 1, 1, tzinfo=UTC),
        node=np.arange(gpus) // 8,
        failure_gpu=failures[:, 0],
        failure_hour=failures[:, 1],
        failure_xid=np.full(5, 79),
        alive_end=np.ones((gpus, nb), dtype=bool),
    )


def test_oracle_recall_counts_only_failures_of_the_test_span():
    cfg = EvalConfig(
        features=FeatureConfig(window_h=24, recent_h=12, horizon_h=48), train_days=10, period_days=10, budget=0.5
    )
    res = evaluate(_hand_arrays(), [ORACLE], cfg, modes=("once",))
    # test span [240, 672): failures at 300 and 500, both foreseen by the oracle; 680 lies after the span
    assert res.failures == 2
    assert res.table["recall"].to_list() == [1.0]


def test_errors(arrays):
    with pytest.raises(HealthError, match="unknown model"):
        evaluate(arrays, ["gbdt", "nope"], CFG)
    with pytest.raises(HealthError, match="unknown mode"):
        evaluate(arrays, [ORACLE], CFG, modes=("weekly",))
    with pytest.raises(HealthError, match="leaves no room"):
        evaluate(arrays, [ORACLE], EvalConfig(features=FC, train_days=40))
    with pytest.raises(HealthError, match="leaves no room"):
        evaluate(arrays, [ORACLE], EvalConfig(features=FC, train_days=3))
