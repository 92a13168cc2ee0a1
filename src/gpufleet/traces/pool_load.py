"""An inference load laid over a cluster's inference pools for a number of days: the summary and the steps that
``gpufleet traces inference`` prints, writes as CSV and plots."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpufleet.errors import ConfigError, SpecError

if TYPE_CHECKING:
    import polars as pl

    from gpufleet.spec import ClusterSpec

__all__ = ["pool_load"]


def pool_load(
    source: str, spec: ClusterSpec, days: float, headroom: float | None = None, step: float | None = None
) -> tuple[dict[str, Any], pl.DataFrame]:
    """``source``'s load on ``spec``'s inference pools over ``days``: (summary, steps with time_s,
    servers_needed and idle_servers). ``headroom`` and ``step`` (seconds) pass to the load when given."""
    from gpufleet.traces import load_inference

    if not (math.isfinite(days) and days > 0):
        raise ConfigError("--days must be a positive number")
    pools = spec.inference_pools
    if not pools:
        raise SpecError(
            f"cluster {spec.name!r} has no inference pool; add a [[pools]] table with "
            'kind = "inference" or pass --cluster with one'
        )
    pool_servers = sum(p.nodes for p in pools)
    until_s = days * 86400.0
    opts = {k: v for k, v in (("headroom", headroom), ("step_s", step)) if v is not None}
    load = load_inference(source, pool_servers=pool_servers, until_s=until_s, **opts)
    summary = {"source": source, "cluster": spec.name, "days": days, **load.describe(0.0, until_s)}
    frame = load.to_frame()
    return summary, frame.filter(frame["time_s"] < until_s)
