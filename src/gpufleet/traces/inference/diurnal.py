"""The ``diurnal`` source: a parametric cosine day between a trough and a peak share of the pool, with noise."""

from __future__ import annotations

import math

import numpy as np

from gpufleet.traces.inference import register_source
from gpufleet.traces.inference.load import EPS, InferenceLoad, check_common, require


@register_source("diurnal", order=1)
def diurnal_load(
    pool_servers: int,
    *,
    until_s: float,
    peak: float = 0.9,
    trough: float = 0.2,
    period_s: float = 86400.0,
    peak_hour: float = 14.0,
    step_s: float = 300.0,
    noise: float = 0.05,
    seed: int = 0,
) -> InferenceLoad:
    """A cosine day: servers needed swing between ``trough`` and ``peak`` shares of the pool.

    At the start of each ``step_s`` step, share = trough + (peak - trough) * (1 + cos(2 pi (t - peak_hour
    * 3600) / period_s)) / 2, times (1 + noise * N(0, 1)) drawn with ``np.random.default_rng(seed)``;
    servers = ceil(share * pool_servers), clipped to [0, pool_servers]. The mean utilisation is about
    (peak + trough) / 2 plus half a server of rounding. ConfigError for 0 <= trough <= peak <= 1,
    period_s > 0, 0 <= peak_hour < period_s / 3600, step_s > 0, noise >= 0 broken.
    """
    where = "diurnal_load"
    check_common(pool_servers, until_s, step_s, where)
    require(
        0 <= trough <= peak <= 1,
        f"{where}: need 0 <= trough <= peak <= 1 (shares of the pool), got trough={trough!r}, peak={peak!r}",
    )
    require(math.isfinite(period_s) and period_s > 0, f"{where}: period_s must be positive seconds, got {period_s!r}")
    require(
        math.isfinite(peak_hour) and 0 <= peak_hour * 3600.0 < period_s,
        f"{where}: peak_hour must lie in [0, period_s / 3600 = {period_s / 3600:g}), got {peak_hour!r}",
    )
    require(math.isfinite(noise) and noise >= 0, f"{where}: noise must be >= 0 (0.05 = 5 % sd), got {noise!r}")
    n = max(1, math.ceil(until_s / step_s))
    time = np.arange(n, dtype=np.float64) * step_s
    share = trough + (peak - trough) * 0.5 * (1.0 + np.cos(2.0 * np.pi * (time - peak_hour * 3600.0) / period_s))
    if noise > 0:
        share = share * (1.0 + noise * np.random.default_rng(seed).standard_normal(n))
    servers = np.clip(np.ceil(share * pool_servers - EPS), 0, pool_servers).astype(np.int64)
    return InferenceLoad("diurnal", time, servers, pool_servers)
