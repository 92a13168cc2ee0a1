"""The ``none`` source: no inference traffic, every server of the pool always idle."""

from __future__ import annotations

import numpy as np

from gpufleet.traces.inference import register_source
from gpufleet.traces.inference.load import InferenceLoad, check_common


@register_source("none", order=2)
def no_load(pool_servers: int, *, until_s: float) -> InferenceLoad:
    """No inference traffic: all servers idle all the time."""
    check_common(pool_servers, until_s, 1.0, "load_inference('none')")
    return InferenceLoad("none", np.zeros(1), np.zeros(1, dtype=np.int64), pool_servers)
