"""The saved predictor (round trip, bad files, latest ranking, rolling alerts) and the API the simulator reads."""

from __future__ import annotations

import pickle
from datetime import timedelta

import numpy as np
import polars as pl
import pytest

from gpufleet.errors import HealthError
from gpufleet.health import xid
from gpufleet.health.events import failure_events, predicted_alerts
from gpufleet.health.features import FeatureConfig, candidate_instances
from gpufleet.health.fleet_arrays import build_arrays
from gpufleet.health.generator import FleetConfig, generate_fleet
from gpufleet.health.models.ensembles import top_k_per_round
from gpufleet.health.predictor import Predictor, predict_latest, rolling_alerts, train_predictor

FC = FeatureConfig(window_h=72, recent_h=24, horizon_h=48)
CFG = FleetConfig(gpus=128, days=30, seed=6, failure_scale=80)
TRAIN_END_H = 20 * 24


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The fleet file, its arrays, and a gbdt predictor trained on its first 20 days only."""
    folder = tmp_path_factory.mktemp("pred")
    full = folder / "fleet.parquet"
    generate_fleet(CFG, full)
    early = folder / "early.parquet"
    frame = pl.read_parquet(full)
    frame.filter(pl.col("time") < CFG.start + timedelta(hours=TRAIN_END_H)).write_parquet(early)
    pred = train_predictor(
        build_arrays(early), "gbdt", FC, train_days=10, calibrate_days=5, budget=0.02, source=str(full.resolve())
    )
    return full, build_arrays(full), pred, frame


def test_trained_metadata(fleet):
    _, arrays, pred, _ = fleet
    assert pred.model_name == "gbdt" and pred.bin_h == 6 and pred.features == FC and pred.budget == 0.02
    assert pred.trained["end_hour"] == TRAIN_END_H and pred.trained["positives"] > 0
    assert pred.trained["fleet_start"] == arrays.start.isoformat()
    assert pred.calibration is not None
    p = pred.probability(np.array([-np.inf, -1.0, 0.0, 0.5, 1.0, 2.0]))
    assert np.all((p >= 0) & (p <= 1)) and np.all(np.diff(p) >= 0)


def test_save_load_round_trip(fleet, tmp_path):
    _, arrays, pred, _ = fleet
    path = pred.save(tmp_path / "sub" / "model.zip")
    back = Predictor.load(path)
    gpu, hour = candidate_instances(arrays, FC, 0, 10_000, every_h=24)
    np.testing.assert_array_equal(back.scores(arrays, gpu, hour), pred.scores(arrays, gpu, hour))
    assert back.trained == pred.trained and back.features == pred.features


def test_load_rejects_bad_files(fleet, tmp_path):
    _, _, pred, _ = fleet
    good = pred.save(tmp_path / "model.zip").read_bytes()
    truncated = tmp_path / "truncated.zip"
    truncated.write_bytes(good[: len(good) // 2])
    foreign = tmp_path / "foreign.pkl"
    foreign.write_bytes(pickle.dumps({"model": "gbdt"}))
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    for path in (truncated, foreign, text, tmp_path / "missing.zip"):
        with pytest.raises(HealthError, match=path.name):
            Predictor.load(path)


def test_load_asks_to_retrain_a_model_with_older_features(fleet, tmp_path):
    _, _, pred, _ = fleet
    from dataclasses import replace

    old = tmp_path / "old.pkl"  # older gpufleets wrote pickles: refused unopened, with the same fix
    old.write_bytes(pickle.dumps(replace(pred, format="gpufleet.health.predictor/1")))
    with pytest.raises(HealthError, match=r"older gpufleets wrote pickles.*retrain"):
        Predictor.load(old)


def test_predict_latest_ranks_by_score(fleet):
    _, arrays, pred, _ = fleet
    at = 25 * 24
    top = predict_latest(pred, arrays, top=7, at_hour=at + 3)  # rounded down to the bin boundary
    gpu, hour = candidate_instances(arrays, FC, at, at + 1)
    scores = pred.scores(arrays, gpu, hour)
    assert top.height == 7 and top["rank"].to_list() == list(range(1, 8))
    assert top["score"].to_list() == sorted(top["score"].to_list(), reverse=True)
    assert sorted(scores, reverse=True)[:7] == pytest.approx(top["score"].to_list())
    for g, s in zip(top["gpu"].to_list(), top["score"].to_list(), strict=True):
        assert scores[gpu.tolist().index(g)] == pytest.approx(s)
    assert top["node"].to_list() == [g // 8 for g in top["gpu"].to_list()]
    assert set(top["time"].to_list()) == {arrays.start + timedelta(hours=at)}
    k = max(1, round(0.02 * len(gpu)))
    assert top["alert"].to_list() == [i < k for i in range(7)]


def test_predict_latest_defaults_to_the_end_of_the_telemetry(fleet):
    _, arrays, pred, _ = fleet
    top = predict_latest(pred, arrays, top=5)
    assert top.height == 5
    assert set(top["time"].to_list()) == {arrays.start + timedelta(hours=arrays.n_bins * arrays.bin_h)}


def test_rolling_alerts_are_each_rounds_top_k(fleet):
    _, arrays, pred, _ = fleet
    alerts = rolling_alerts(pred, arrays, start_h=TRAIN_END_H, every_h=24)
    assert alerts.columns == ["gpu", "node", "hour", "score"]
    assert alerts.height > 0 and (alerts["hour"] >= TRAIN_END_H).all() and (alerts["hour"] % 24 == 0).all()
    for h in (TRAIN_END_H, TRAIN_END_H + 72):
        gpu, hour = candidate_instances(arrays, FC, h, h + 1)
        scores = pred.scores(arrays, gpu, hour)
        k = max(1, round(0.02 * len(gpu)))
        want = set(gpu[np.argsort(-scores)[:k]].tolist())
        assert set(alerts.filter(pl.col("hour") == h)["gpu"].to_list()) == want
        assert top_k_per_round(hour, scores, 0.02).sum() == k


def test_failure_events_are_the_hard_xids(fleet):
    full, _, _, frame = fleet
    ev = failure_events(full)
    assert ev.columns == ["gpu", "node", "time_s", "xid"]
    assert ev["time_s"].to_list() == sorted(ev["time_s"].to_list())
    t0 = frame["time"].min()
    hard = frame.filter(
        pl.col("DCGM_FI_DEV_XID_ERRORS").map_elements(lambda c: xid.severity(c) == "hard", return_dtype=pl.Boolean)
    )
    want = sorted(
        ((t - t0).total_seconds(), g, n, c)
        for g, n, t, c in hard.select("gpu", "node", "time", "DCGM_FI_DEV_XID_ERRORS").iter_rows()
    )
    got = sorted((s, g, n, c) for g, n, s, c in ev.iter_rows())
    assert got == want and len(got) > 0
    truth = pl.read_parquet(full.with_name("fleet.failures.parquet"))
    assert sorted(zip(truth["gpu"].to_list(), (truth["hour"] * 3600.0).to_list(), strict=True)) == sorted(
        zip(ev["gpu"].to_list(), ev["time_s"].to_list(), strict=True)
    )


def test_failure_events_errors(tmp_path, fleet):
    with pytest.raises(HealthError, match="no such telemetry file"):
        failure_events(tmp_path / "nope.parquet")
    no_xid = tmp_path / "no_xid.parquet"
    fleet[3].drop("DCGM_FI_DEV_XID_ERRORS").head(10).write_parquet(no_xid)
    with pytest.raises(HealthError, match="DCGM_FI_DEV_XID_ERRORS"):
        failure_events(no_xid)


def test_predicted_alerts_start_after_training_on_the_same_file(fleet, tmp_path):
    full, _, pred, _ = fleet
    model = pred.save(tmp_path / "model.zip")
    alerts = predicted_alerts(model, full)
    assert alerts.columns == ["gpu", "node", "time_s", "score"]
    assert alerts.height > 0 and (alerts["time_s"] >= TRAIN_END_H * 3600).all()
    # the same model on a file it was not trained on alerts from the first full window on
    other = Predictor(
        model=pred.model,
        model_name=pred.model_name,
        features=pred.features,
        bin_h=pred.bin_h,
        budget=pred.budget,
        trained={**pred.trained, "source": "/elsewhere/fleet.parquet"},
    )
    alerts_other = predicted_alerts(other.save(tmp_path / "other.zip"), full)
    assert alerts_other["time_s"].min() == FC.window_h * 3600.0
    # the alerts after the training end are the same rounds either way
    late = alerts_other.filter(pl.col("time_s") >= TRAIN_END_H * 3600)
    assert sorted(late.select("gpu", "time_s").rows()) == sorted(alerts.select("gpu", "time_s").rows())


def test_predictor_horizon_is_what_simulate_drains_for(fleet, tmp_path):
    from gpufleet.health.events import predictor_horizon_h

    _, _, pred, _ = fleet
    path = pred.save(tmp_path / "model.zip")
    assert predictor_horizon_h(path) == float(FC.horizon_h)
    with pytest.raises(HealthError):
        predictor_horizon_h(tmp_path / "missing.zip")
