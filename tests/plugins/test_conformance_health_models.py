"""Every registered failure model, on 240 tiny instances: it fits (returning itself) and scores one finite
float per instance, ranks the obvious failures first, and an unknown option is a one-line ConfigError."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.errors import ConfigError
from gpufleet.health.models.base import MODELS, FailureModel, make_model, model_names
from gpufleet.health.samples import Samples

#: small and quick for the torch models (the others ignore torch options)
FAST = {"epochs": 1, "epoch_size": 256, "batch_size": 64, "max_train": 1000, "threads": 1}


def _samples(n: int = 240, seed: int = 0) -> Samples:
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % 8 == 0).astype(np.int8)
    tab = rng.normal(size=(n, 6)).astype(np.float32)
    tab[:, 0] += 4.0 * y  # failures run hot: an easy signal
    seq = np.repeat(tab[:, None, :3], 4, axis=1)
    return Samples(
        gpu=np.arange(n, dtype=np.uint32),
        time=np.repeat(np.arange(n // 8, dtype=np.int64), 8),
        tabular=tab,
        sequence=seq,
        y=y,
        feature_names=[f"f{i}" for i in range(6)],
        channel_names=["c0", "c1", "c2"],
    )


@pytest.mark.parametrize("name", MODELS.plugin_names())
def test_model_fits_and_scores_one_float_per_instance(name: str) -> None:
    summary = model_names()[name]
    assert summary and "\n" not in summary
    model = make_model(name, torch_options=FAST)
    assert isinstance(model, FailureModel)
    train = _samples()
    assert model.fit(train) is model
    test = _samples(seed=1)
    scores = np.asarray(model.score(test), dtype=np.float64)
    assert scores.shape == (len(test),) and not np.isnan(scores).any()


@pytest.mark.parametrize("name", MODELS.plugin_names())
def test_model_rejects_an_unknown_option_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_model(name, no_such_option=1)
    assert "no_such_option" in str(info.value) and "\n" not in str(info.value)
