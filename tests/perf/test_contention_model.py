"""The contention model fitted on DeepShare's real co-location matrix: accuracy on held-back cells, the shape of
its predictions, persistence, the shipped model, isolated throughput and the loader's errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import gpufleet
from gpufleet.errors import ConfigError
from gpufleet.perf.contention import (
    DEEPSHARE_MODELS,
    ContentionModel,
    DeepShareData,
    default_deepshare_folder,
    fit_contention,
    load_deepshare,
    predicted_ratios,
    victim_type_mask,
)

DATA = default_deepshare_folder()  # DeepShare's tables as shipped in the wheel
BAR = 0.08


@pytest.fixture(scope="module")
def data() -> DeepShareData:
    return load_deepshare(DATA)


def test_shipped_tables_are_the_default_and_complete(data) -> None:
    assert DATA.parent == Path(gpufleet.__file__).parent / "data"
    default = load_deepshare()
    assert default.keys == data.keys and np.array_equal(default.ratios, data.ratios)
    assert len(data.keys) == 36 and data.ratios.shape == (36, 36)
    assert (DATA / "LICENSE.DeepShare").read_text().lstrip().startswith("Apache License")


@pytest.fixture(scope="module")
def fit0(data):
    return fit_contention(data, holdout=0.3, seed=0)


def test_loader_reads_the_full_matrix(data):
    assert len(data.keys) == 36 and data.ratios.shape == (36, 36)
    assert {k[0] for k in data.keys} == set(DEEPSHARE_MODELS)
    assert set(data.isolated) == set(data.keys)
    assert len(data.samples) == 18


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_held_back_cells_within_bar(data, seed):
    fit = fit_contention(data, holdout=0.3, seed=seed)
    summary = fit.summary()
    assert summary["free_constants"] == 24
    assert 0.2 * 1296 < summary["held_back"] < 0.4 * 1296
    assert fit.test_mae <= BAR, summary
    assert fit.train_mae <= BAR
    assert fit.test_max >= fit.test_mae


def test_victim_type_mask_holds_back_whole_rows():
    mask = victim_type_mask(36, 0.3, seed=5)
    rows_out = ~mask.all(axis=1)
    assert rows_out.sum() == round(0.3 * 36)
    assert (mask[rows_out] == False).all() and mask[~rows_out].all()  # noqa: E712
    assert (victim_type_mask(36, 0.3, seed=5) == mask).all()
    assert victim_type_mask(36, 0.99, seed=0).any()  # at least one type always trains
    with pytest.raises(ConfigError, match="holdout"):
        victim_type_mask(36, 0.0)


def test_predicted_ratios_in_unit_interval(fit0, data):
    assert ((fit0.predicted > 0) & (fit0.predicted <= 1)).all()
    full = predicted_ratios(fit0.model, data.keys)
    np.testing.assert_allclose(full, fit0.predicted, rtol=1e-9)
    single = predicted_ratios(fit0.model, [(m, g, 1) for m in DEEPSHARE_MODELS for g in (1, 2, 4, 8)])
    assert ((single > 0) & (single <= 1)).all()


def test_single_node_has_no_sensitivity(fit0):
    model = fit0.model
    for m in DEEPSHARE_MODELS:
        for g in (1, 2, 4, 8):
            assert model.sensitivity(m, g, 1) == 0.0
            assert model.intensity(m, g, 1) == 0.0
            assert model.pair_ratio((m, g, 1), ("FSDP", 8, 2)) == 1.0
        assert model.sensitivity(m, 8, 2) > 0.0


def test_save_load_round_trip(fit0, tmp_path):
    path = tmp_path / "model.json"
    fit0.model.save(path)
    loaded = ContentionModel.load(path)
    assert loaded == fit0.model
    assert loaded.to_dict() == fit0.model.to_dict()


def test_default_model_is_the_seed0_fit(fit0, data):
    default = ContentionModel.default()
    assert default.models == list(DEEPSHARE_MODELS)
    pred = predicted_ratios(default, data.keys)
    held = ~fit0.train_mask
    # the optimiser's stopping point moves between SciPy/BLAS builds by ~1e-9 in MAE; a refit would move it far more
    assert float(np.abs(pred - data.ratios)[held].mean()) == pytest.approx(fit0.test_mae, abs=1e-6)


@pytest.mark.parametrize("model", [pytest.param("fit", id="fit"), pytest.param("default", id="default")])
def test_isolated_throughput(model, fit0, data):
    m = fit0.model if model == "fit" else ContentionModel.default()
    for (name, gpus, nodes), value in data.isolated.items():
        assert m.isolated_throughput(name, gpus, nodes) == value
    # intra-node assumption: moving the network share onto PCIe never makes one node slower than two
    for name in DEEPSHARE_MODELS:
        for gpus in (2, 4, 8):
            assert m.isolated_throughput(name, gpus, 1) >= data.isolated[(name, gpus, 2)]


@pytest.mark.parametrize(
    "absent", ["deepshare_isolated_thp.csv", "deepshare_shared_thp_ratio.csv", "deepshare_total_samples_trained.csv"]
)
def test_missing_file_names_it(tmp_path, absent):
    for src in DATA.glob("deepshare_*.csv"):
        if src.name != absent:
            shutil.copy(src, tmp_path / src.name)
    with pytest.raises(ConfigError) as exc:
        load_deepshare(tmp_path)
    # the missing list names exactly the absent file, by its full path
    assert str(exc.value).startswith(f"contention data missing: {tmp_path / absent} (")


def test_bad_holdout_is_a_config_error(data):
    with pytest.raises(ConfigError, match="holdout"):
        fit_contention(data, holdout=1.0)
