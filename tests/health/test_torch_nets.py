"""The torch failure models (mlp, lstm, cnn1d): they learn, and they are deterministic, picklable and strict."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("torch")
from sklearn.metrics import average_precision_score, roc_auc_score

from gpufleet.errors import HealthError
from gpufleet.health.models import base
from gpufleet.health.models.torch_nets import (
    CNN1DModel,
    LSTMModel,
    MLPModel,
    RobustScaler,
    SamplesShapeError,
    _stratified_cap,
    _time_split,
)
from gpufleet.health.samples import Samples

FAST = {"epochs": 4, "batch_size": 128, "epoch_size": None, "patience": 4}
MODELS = {"mlp": MLPModel, "lstm": LSTMModel, "cnn1d": CNN1DModel}


def _samples(n: int, seed: int, t0: int = 0, steps: int = 12, channels: int = 4, features: int = 6) -> Samples:
    """Instances with two learnable signals, noise, heavy tails and NaN; ``y`` is the sequence signal.

    The sequence label is a rising ramp in channel 0 over the last 4 steps; the tabular label (see
    :func:`_for`) is the product of features 0 and 1 above 1: an interaction, not a single threshold.
    ``time`` runs from ``t0`` with ties (10 instances per hour).
    """
    rng = np.random.default_rng(seed)
    seq = rng.standard_normal((n, steps, channels)).astype(np.float32)
    y_seq = rng.random(n) < 0.08
    seq[:, -4:, 0] += (y_seq[:, None] * np.linspace(0.5, 2.0, 4)).astype(np.float32)
    seq[:, :, 1] = rng.pareto(1.5, (n, steps)) * 1e4  # a heavy-tailed counter, pure noise
    tab = rng.standard_normal((n, features)).astype(np.float32)
    tab[:, 2] = rng.lognormal(3, 2, n)  # heavy-tailed noise
    seq[rng.random(seq.shape) < 0.05] = np.nan
    tab[:, 3:][rng.random((n, features - 3)) < 0.05] = np.nan  # NaN only in noise features
    seq[::97] = np.nan  # whole instances missing
    return Samples(
        gpu=rng.integers(0, 200, n).astype(np.uint32),
        time=(t0 + np.arange(n) // 10).astype(np.int64),
        tabular=tab,
        sequence=seq,
        y=y_seq.astype(np.int8),
    )


def _for(name: str, s: Samples) -> Samples:
    """The instance set with the label that model ``name`` can learn (2 % of tabular labels flipped)."""
    if name in ("lstm", "cnn1d"):
        return s
    flip = np.random.default_rng(len(s)).random(len(s)) < 0.02
    y = (s.tabular[:, 0] * s.tabular[:, 1] > 1.0) ^ flip
    return Samples(gpu=s.gpu, time=s.time, tabular=s.tabular, sequence=s.sequence, y=y.astype(np.int8))


@pytest.fixture(scope="module")
def data() -> tuple[Samples, Samples]:
    """A training set, then a test set later in time."""
    return _samples(3000, seed=1), _samples(2000, seed=2, t0=1000)


@pytest.fixture(scope="module")
def fitted(data: tuple[Samples, Samples]) -> dict[str, object]:
    train, _ = data
    return {name: cls(seed=3, **FAST).fit(_for(name, train)) for name, cls in MODELS.items()}


def test_registered() -> None:
    for name, cls in MODELS.items():
        model = base.make_model(name, seed=7, epochs=2)
        assert type(model) is cls and model.name == name and model.seed == 7
        assert isinstance(model, base.FailureModel)


@pytest.mark.parametrize("name", list(MODELS))
def test_learns_the_signal_on_later_instances(name: str, data: tuple[Samples, Samples], fitted: dict) -> None:
    _, test = data
    test = _for(name, test)
    scores = fitted[name].score(test)
    assert scores.shape == (len(test),) and scores.dtype == np.float32
    assert np.isfinite(scores).all()
    assert roc_auc_score(test.y, scores) > 0.8  # measured 0.91-0.95 over seeds
    assert average_precision_score(test.y, scores) > 3 * test.y.mean()  # base rate 8-12 %; measured 0.65-0.82
    assert fitted[name].history_, "validation on the latest 10 % by time should have run"


@pytest.mark.parametrize("name", list(MODELS))
def test_same_seed_same_scores_and_pickle_round_trip(name: str, data: tuple[Samples, Samples], fitted: dict) -> None:
    train, test = data
    again = MODELS[name](seed=3, **FAST).fit(_for(name, train))
    expected = fitted[name].score(test)
    np.testing.assert_array_equal(again.score(test), expected)
    restored = pickle.loads(pickle.dumps(fitted[name]))
    np.testing.assert_array_equal(restored.score(test), expected)


@pytest.mark.parametrize("name", list(MODELS))
def test_chunked_scoring_equals_one_batch(name: str, data: tuple[Samples, Samples], fitted: dict) -> None:
    _, test = data
    model = pickle.loads(pickle.dumps(fitted[name]))
    model.chunk_size = 10_000
    whole = model.score(test)
    model.chunk_size = 7
    np.testing.assert_allclose(model.score(test), whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_nan_and_inf_inputs_give_finite_scores(name: str, data: tuple[Samples, Samples], fitted: dict) -> None:
    _, test = data
    odd = test.take(np.arange(50))
    odd.tabular[:10] = np.nan
    odd.sequence[:10] = np.nan
    odd.tabular[10:20] = np.inf
    odd.sequence[10:20, :, 1] = -np.inf
    assert np.isfinite(fitted[name].score(odd)).all()


def test_shape_errors_are_clear(data: tuple[Samples, Samples], fitted: dict) -> None:
    _, test = data
    fewer = Samples(gpu=test.gpu, time=test.time, tabular=test.tabular[:, :4], sequence=test.sequence[:, :, :3])
    for name in MODELS:
        with pytest.raises(ValueError, match="fitted on instances of shape"):
            fitted[name].score(fewer)
    flat = Samples(gpu=test.gpu, time=test.time, tabular=test.tabular[:, 0], sequence=test.sequence[:, :, 0])
    with pytest.raises(SamplesShapeError, match=r"Samples.tabular of shape \(n, features\)"):
        fitted["mlp"].score(flat)
    with pytest.raises(SamplesShapeError, match=r"Samples.sequence of shape \(n, steps, channels\)"):
        fitted["cnn1d"].score(flat)
    with pytest.raises(HealthError, match="labelled"):
        MLPModel().fit(Samples(gpu=test.gpu, time=test.time, tabular=test.tabular, sequence=test.sequence))
    with pytest.raises(HealthError, match="not fitted"):
        LSTMModel().score(test)


def test_single_class_training_scores_a_constant(data: tuple[Samples, Samples]) -> None:
    train, test = data
    negatives = Samples(
        gpu=train.gpu, time=train.time, tabular=train.tabular, sequence=train.sequence, y=np.zeros(len(train), np.int8)
    )
    with pytest.warns(RuntimeWarning, match="one class"):
        model = CNN1DModel(**FAST).fit(negatives)
    scores = model.score(test)
    assert np.isfinite(scores).all() and np.ptp(scores) == 0


def test_validation_is_the_latest_by_time_and_never_splits_an_hour() -> None:
    rng = np.random.default_rng(0)
    time = rng.permutation(np.arange(1000) // 10)  # shuffled order, 10 instances per hour
    y = (rng.random(1000) < 0.2).astype(np.float32)
    train, val = _time_split(time, y, 0.1)
    assert len(val) == 100 and len(train) == 900
    assert time[val].min() > time[train].max()
    # a validation set with no positive cannot rank: every instance trains
    y[time >= 90] = 0
    train, val = _time_split(time, y, 0.1)
    assert len(val) == 0 and len(train) == 1000


def test_max_train_keeps_class_proportions() -> None:
    y = np.zeros(10_000, np.float32)
    y[::50] = 1  # 2 %
    keep = _stratified_cap(y, 1000, np.random.default_rng(0))
    assert len(keep) == 1000 and np.all(np.diff(keep) > 0)
    assert y[keep].sum() == 20


def test_scaler_is_robust_to_heavy_tails_and_marks_missing_columns() -> None:
    rng = np.random.default_rng(0)
    x = np.stack([rng.pareto(1.0, 5000) * 1e6, rng.standard_normal(5000)], axis=1).astype(np.float32)
    x[::10, 1] = np.nan
    scaler = RobustScaler.fit(x, rng)
    out = scaler.transform(x).numpy()
    assert out.shape == (5000, 3) and scaler.n_out == 3  # column 1 gets a missing indicator
    assert np.isfinite(out).all() and np.abs(out).max() <= 8.0
    assert np.abs(np.median(out[:, :2], axis=0)).max() < 0.1
    np.testing.assert_array_equal(out[:, 2], np.isnan(x[:, 1]))
    seq = RobustScaler.fit(x.reshape(500, 10, 2), rng, per_column=False)
    assert seq.n_out == 3 and seq.transform(x.reshape(500, 10, 2)).shape == (500, 10, 3)


def test_training_does_not_touch_global_torch_state(data: tuple[Samples, Samples]) -> None:
    import torch

    train, _ = data
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    MLPModel(threads=1, **FAST).fit(_for("mlp", train))
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads
