"""Every registered inference-load source, on a tiny pool and one day: it makes a valid load for that pool,
and an unknown option is a one-line ConfigError. A new source file is picked up."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.errors import ConfigError
from gpufleet.traces.inference import SOURCES, InferenceLoad, inference_sources, load_inference

DAY = 86400.0


def test_every_source_is_listed() -> None:
    assert sorted(inference_sources()) == SOURCES.names()


@pytest.mark.parametrize("name", SOURCES.plugin_names())
def test_source_makes_a_load_for_the_pool(name: str) -> None:
    summary = SOURCES.summary(name)
    assert summary and "\n" not in summary
    load = load_inference(name, pool_servers=4, until_s=DAY)
    assert isinstance(load, InferenceLoad) and load.pool_servers == 4
    assert load.time_s[0] == 0.0 and np.all(np.diff(load.time_s) > 0)
    assert load.servers.min() >= 0 and load.servers.max() <= 4
    assert 0.0 <= load.mean_utilisation(0.0, DAY) <= 1.0


@pytest.mark.parametrize("name", SOURCES.plugin_names())
def test_source_rejects_an_unknown_option_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_inference(name, pool_servers=4, until_s=DAY, no_such_option=1)
    assert "no_such_option" in str(info.value) and "\n" not in str(info.value)
