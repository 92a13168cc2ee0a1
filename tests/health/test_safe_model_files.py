"""Failure-model files hold only data: every model predicts the same after a save and load, and a crafted
pickle given as a model never runs, from the library or from the command line (one-line error, no traceback)."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
import zipfile

import numpy as np
import polars as pl
import pytest

from gpufleet.errors import HealthError
from gpufleet.health.features import FeatureConfig, candidate_instances
from gpufleet.health.fleet_arrays import build_arrays
from gpufleet.health.generator import FleetConfig, generate_fleet
from gpufleet.health.models import persist
from gpufleet.health.models.base import model_factory, model_names
from gpufleet.health.models.persist import ARRAYS, MANIFEST, ModelFileError, save_file
from gpufleet.health.predictor import Predictor, train_predictor

FC = FeatureConfig(window_h=72, recent_h=24, horizon_h=48)
FAST = {"epochs": 2, "max_train": 5_000}


class WritesFile:
    """Unpickling this calls ``open(path, "w")``: a payload that creates a file, as an attacker's would."""

    def __init__(self, path: object) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A small fleet file and its arrays."""
    path = tmp_path_factory.mktemp("safe") / "fleet.parquet"
    generate_fleet(FleetConfig(gpus=128, days=30, seed=6, failure_scale=80), path)
    return path, build_arrays(path)


@pytest.fixture(scope="module")
def gbdt(fleet):
    _, arrays = fleet
    return train_predictor(arrays, "gbdt", FC, train_days=10, calibrate_days=5, budget=0.02)


#: every model gpufleet registers (test modules register stand-ins of their own: not these)
BUILT_IN = [n for n in sorted(model_names()) if model_factory(n).__module__.startswith("gpufleet.")]


def test_the_built_in_models_are_all_here():
    assert {"gbdt", "mlp", "lstm", "cnn1d", "parallel", "cascade"} <= set(BUILT_IN)


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_model_predicts_the_same_after_a_round_trip(name, fleet, tmp_path):
    _, arrays = fleet
    pred = train_predictor(arrays, name, FC, train_days=10, calibrate_days=5, budget=0.02, torch_options=FAST)
    saved = pred.save(tmp_path / "model.zip")
    back = Predictor.load(saved)
    gpu, hour = candidate_instances(arrays, FC, 0, 10_000, every_h=24)
    np.testing.assert_array_equal(back.scores(arrays, gpu, hour), pred.scores(arrays, gpu, hour))
    assert type(back.model) is type(pred.model)
    assert (back.model_name, back.features, back.bin_h, back.budget) == (name, FC, pred.bin_h, 0.02)
    assert back.trained == pred.trained
    if pred.calibration is None:
        assert back.calibration is None
    else:
        for a, b in zip(back.calibration, pred.calibration, strict=True):
            np.testing.assert_array_equal(a, b)
    # JSON, safetensors and LightGBM text only; the same model writes the same bytes
    with zipfile.ZipFile(saved) as zf:
        names = set(zf.namelist())
        manifest = json.loads(zf.read(MANIFEST))
    assert names - {MANIFEST, ARRAYS} == {n for n in names if n.startswith("lightgbm/") and n.endswith(".txt")}
    assert manifest["format"] == "gpufleet.health.predictor/3"
    assert pred.save(tmp_path / "again.zip").read_bytes() == saved.read_bytes()
    # the size limits on reading leave real models a wide margin (these members are KiBs to hundreds of KiBs)
    limits = {MANIFEST: persist._MANIFEST_LIMIT, ARRAYS: persist._ARRAYS_LIMIT}
    with zipfile.ZipFile(saved) as zf:
        for info in zf.infolist():
            assert info.file_size * 100 < limits.get(info.filename, persist._TEXT_LIMIT), info


def test_the_crafted_payload_is_live(tmp_path):
    """The control: unpickling the payload does create its file, so its absence below means it never ran."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(WritesFile(marker))).close()
    assert marker.exists()


def test_a_crafted_pickle_never_runs_in_the_library(fleet, tmp_path):
    from gpufleet.health.events import predicted_alerts, predictor_horizon_h

    path, _ = fleet
    marker = tmp_path / "ran"
    evil = tmp_path / "model.pkl"
    evil.write_bytes(pickle.dumps(WritesFile(marker)))
    for load in (Predictor.load, predictor_horizon_h, lambda m: predicted_alerts(m, path)):
        with pytest.raises(HealthError, match=r"model\.pkl: a pickle, not a gpufleet failure model.*retrain"):
            load(evil)
    assert not marker.exists()


@pytest.mark.parametrize("command", ["predict", "simulate"])
def test_a_crafted_pickle_never_runs_from_the_command_line(command, fleet, tmp_path):
    path, _ = fleet
    marker = tmp_path / "ran"
    evil = tmp_path / "model.pkl"
    evil.write_bytes(pickle.dumps(WritesFile(marker)))
    if command == "predict":
        args = ["health", "predict", str(evil), str(path)]
    else:
        trace = tmp_path / "jobs.csv"
        pl.DataFrame(
            {"job_id": ["a", "b"], "submit_s": [0.0, 60.0], "duration_s": [3600.0, 600.0], "num_gpus": [8, 2]}
        ).write_csv(trace)
        args = [
            "simulate",
            "--trace",
            str(trace),
            "--failures",
            str(path),
            "--predictor",
            str(evil),
            "--policy",
            "fifo",
            "--no-progress",
        ]
    res = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", *args], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert res.returncode != 0
    assert not marker.exists()
    assert "Traceback" not in res.stderr + res.stdout
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.pkl: a pickle" in errors[0] and "retrain" in errors[0]
    assert res.stderr.rstrip().endswith(errors[0])  # the error is the last line: nothing follows it


def _archive(path, manifest: dict, members: dict[str, bytes] | None = None) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(MANIFEST, json.dumps(manifest))
        for name, data in (members or {}).items():
            zf.writestr(name, data)


def _content(model: object) -> dict:
    return {
        "model_name": "gbdt",
        "features": {"window_h": 72, "recent_h": 24, "horizon_h": 48},
        "bin_h": 6,
        "budget": 0.02,
        "trained": {},
        "calibration": None,
        "model": model,
    }


@pytest.mark.parametrize(
    ("model", "members", "message"),
    [
        ({"$model": "os.system", "state": {}}, {}, r"unknown failure model 'os\.system'"),
        ({"$object": "Predictor", "state": {}}, {}, r"unknown or malformed entry '\$object'"),
        ({"$scalar": ["|O", 1]}, {}, r"dtype object"),
        ({"$tuple": [1, 2]}, {}, r"its model is a tuple, not a failure model"),
        ({"$array": "a0"}, {ARRAYS: pickle.dumps(WritesFile("x"))}, r"not a valid gpufleet failure model"),
        ({"$lightgbm": "lightgbm/0.txt"}, {ARRAYS: b"", "lightgbm/0.txt": b"tree\nnonsense"}, r"LightGBMError"),
    ],
)
def test_a_crafted_archive_builds_only_registered_classes(model, members, message, tmp_path):
    path = tmp_path / "crafted.zip"
    _archive(path, {"format": "gpufleet.health.predictor/3", "content": _content(model)}, {ARRAYS: b"", **members})
    with pytest.raises(HealthError, match=message) as err:
        Predictor.load(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_older_and_newer_formats_ask_for_the_right_fix(tmp_path):
    for version, fix in ((2, r"older gpufleet.*retrain"), (4, r"newer gpufleet.*upgrade")):
        path = tmp_path / f"v{version}.zip"
        _archive(path, {"format": f"gpufleet.health.predictor/{version}", "content": None})
        with pytest.raises(HealthError, match=fix):
            Predictor.load(path)


def test_a_model_with_state_that_is_not_data_cannot_be_saved(gbdt, tmp_path):
    from dataclasses import replace

    gbdt.model.hook = print  # e.g. a callable left on the model
    try:
        with pytest.raises(ModelFileError, match=r"model\.model\.hook: a builtin_function_or_method"):
            replace(gbdt).save(tmp_path / "model.zip")
    finally:
        del gbdt.model.hook
    assert not (tmp_path / "model.zip").exists()
    save_file(tmp_path / "plain.zip", "x/1", {"t": (1, 2.5, float("-inf")), "a": np.arange(3, dtype=np.int8)})


def _first_error(path) -> str:
    with pytest.raises(HealthError) as err:
        Predictor.load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def test_a_zip_bomb_is_refused_before_it_expands(tmp_path):
    """A manifest of 65 MiB of spaces deflates to ~65 KiB: its declared size is over the limit, so it is never
    decompressed; and a member whose header understates its size stops at the limit all the same."""
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf, zf.open(MANIFEST, "w") as f:
        for _ in range(65):
            f.write(b" " * 2**20)
    assert bomb.stat().st_size < 2**20
    assert "gpufleet-model.json expands to 65.0 MiB, over the 64.0 MiB limit" in _first_error(bomb)
    liar = tmp_path / "liar.zip"
    with zipfile.ZipFile(liar, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(MANIFEST, b" " * 100_000)
        zf.getinfo(MANIFEST).file_size = 10  # the central directory (what readers trust) says 10 bytes
    assert "BadZipFile" in _first_error(liar)


def test_only_stored_and_deflated_members_are_read(tmp_path):
    path = tmp_path / "lzma.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_LZMA) as zf:
        zf.writestr(MANIFEST, json.dumps({"format": "gpufleet.health.predictor/3", "content": None}))
    assert "compressed with method 14; only stored and deflated members are read" in _first_error(path)


def test_the_lightgbm_members_and_the_total_are_capped(tmp_path, monkeypatch):
    manifest = {"format": "gpufleet.health.predictor/3", "content": _content(None)}
    many = tmp_path / "many.zip"
    _archive(many, manifest, {ARRAYS: b"", **{f"lightgbm/{i}.txt": b"x" for i in range(65)}})
    assert "it holds 65 LightGBM models, more than the 64 read" in _first_error(many)
    big = tmp_path / "big.zip"
    _archive(big, manifest, {ARRAYS: b"\0" * 3000})
    monkeypatch.setattr(persist, "_TOTAL_LIMIT", 3000)
    assert "expand to more than" in _first_error(big)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"$model": "gbdt", "state": {}}, r"its GBDTModel lacks booster, max_pos_weight, n_estimators, params"),
        ({"$model": "gbdt", "module": "os", "state": {}}, r"'os' is not a module of gpufleet\.health\.models"),
        (
            {"$model": "gbdt", "module": "gpufleet.health.models.persist", "state": {}},
            r"gpufleet\.health\.models\.persist registers no failure model 'gbdt'",
        ),
        ({"$model": "gbdt", "module": "gpufleet.health.models.nothere", "state": {}}, r"cannot import"),
    ],
)
def test_a_model_must_come_from_its_module_with_all_its_attributes(model, message, tmp_path):
    path = tmp_path / "crafted.zip"
    _archive(path, {"format": "gpufleet.health.predictor/3", "content": _content(model)}, {ARRAYS: b""})
    assert re.search(message, _first_error(path))


def _gbdt_content(gbdt, tmp_path) -> tuple[dict, dict[str, bytes]]:
    saved = gbdt.save(tmp_path / "good.zip")
    with zipfile.ZipFile(saved) as zf:
        return json.loads(zf.read(MANIFEST)), {n: zf.read(n) for n in zf.namelist() if n != MANIFEST}


def test_a_state_attribute_may_not_hide_a_method(gbdt, tmp_path):
    manifest, members = _gbdt_content(gbdt, tmp_path)
    manifest["content"]["model"]["state"]["score"] = 1
    path = tmp_path / "crafted.zip"
    _archive(path, manifest, members)
    assert "its GBDTModel has an attribute 'score' that hides the class's own" in _first_error(path)


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ({"window_h": "72", "recent_h": 24, "horizon_h": 48}, "features window_h are not whole numbers"),
        ({"window_h": 72.0, "recent_h": True, "horizon_h": 48}, "features window_h, recent_h are not whole"),
        ({"window_h": 72, "recent_h": 24}, "its features are not window_h, recent_h, horizon_h"),
        ({"window_h": 72, "recent_h": 24, "horizon_h": 48, "x": 1}, "its features are not window_h"),
        ([72, 24, 48], "its features are not window_h"),
        ({"window_h": 70, "recent_h": 24, "horizon_h": 48}, "window_h=70 must be a positive multiple of the 6-hour"),
    ],
)
def test_the_feature_windows_must_be_whole_hours_of_the_right_fields(features, message, gbdt, tmp_path):
    manifest, members = _gbdt_content(gbdt, tmp_path)
    manifest["content"]["features"] = features
    path = tmp_path / "crafted.zip"
    _archive(path, manifest, members)
    assert message in _first_error(path)


def test_loading_a_lightgbm_model_does_not_import_torch(gbdt, tmp_path):
    path = gbdt.save(tmp_path / "model.zip")
    code = (
        "import sys\n"
        "from gpufleet.health.predictor import Predictor\n"
        f"p = Predictor.load({str(path)!r})\n"
        "assert type(p.model).__name__ == 'GBDTModel'\n"
        "print('torch' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_a_failed_save_leaves_no_temporary_file(gbdt, tmp_path, monkeypatch):
    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persist.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        gbdt.save(tmp_path / "model.zip")
    assert list(tmp_path.iterdir()) == []
