"""The inference pool as an engine feature: its load over time (servers it needs) and the usage metric,
GPU-time allocated to training and inference over both pools' capacity, over the trace's arrival window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufleet.sim.features.base import Feature
from gpufleet.sim.metrics import time_weighted_mean

if TYPE_CHECKING:
    import polars as pl


def held_schedule(time_s: np.ndarray, servers: np.ndarray, notice_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Servers inference keeps (not loanable) over time when reclaims need ``notice_s`` seconds of notice.

    A server must be back ``notice_s`` before inference needs it, but is loaned only once inference no longer
    needs it, so the held count at ``t`` is the most servers needed anywhere in ``[t, t + notice_s]``. Steps
    whose value repeats the previous one are dropped (fewer simulator events).
    """
    if notice_s > 0:
        times = np.unique(np.concatenate((time_s, np.maximum(time_s - notice_s, time_s[0]))))
        lo = np.searchsorted(time_s, times, side="right") - 1
        hi = np.searchsorted(time_s, times + notice_s, side="right")  # steps starting by t + notice
        prefix = [servers[a : max(b, a + 1)].max() for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
        values = np.asarray(prefix, dtype=np.int64)
    else:
        times, values = time_s, servers
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return times[keep], values[keep]


@dataclass(frozen=True)
class PoolGPUs:
    """The GPU capacities the usage metric divides by: training pools, inference pools, GPUs per inference server."""

    training: int
    inference: int
    per_inference_server: int

    @classmethod
    def of(cls, cluster: Any) -> PoolGPUs:
        per = max((p.gpus_per_node for p in cluster.inference_pools), default=0)
        return cls(cluster.total_gpus("training"), cluster.total_gpus("inference"), per)


def usage_over_window(
    time_s: np.ndarray, busy_gpus: np.ndarray, inference: Any, pools: PoolGPUs, start: float, end: float
) -> float:
    """GPU-time allocated to training and to inference over the capacity of both pools, in [start, end].

    Measured over the trace's arrival window so that the drain after the last arrival does not dilute it.
    Inference holds ``servers_needed x GPUs per server`` of its load; with no load, the inference pool
    counts as fully held.
    """
    if end <= start:
        return float("nan")
    train = time_weighted_mean(time_s, busy_gpus, start, end)
    if inference is None or not pools.per_inference_server:
        inf = pools.inference
    else:
        inf = time_weighted_mean(
            np.asarray(inference.time_s, dtype=np.float64),
            np.asarray(inference.servers, dtype=np.float64) * pools.per_inference_server,
            start,
            end,
        )
    cap = pools.training + pools.inference
    return float((train + inf) / cap) if cap else float("nan")


class InferenceUsage(Feature):
    """Fixed pools (no loaning): the inference load only enters the usage metric of the summary."""

    name = "inference"

    def __init__(self, load: Any, pools: PoolGPUs) -> None:
        self.load = load
        self.pools = pools

    def summary(self, jobs: pl.DataFrame, timeline: pl.DataFrame) -> dict[str, Any]:
        t = timeline["time_s"].to_numpy()
        submit = jobs["submit_s"].to_numpy()
        if not len(t) or not len(submit):
            return {}
        busy = timeline["busy_gpus"].to_numpy()
        return {"usage": usage_over_window(t, busy, self.load, self.pools, float(submit.min()), float(submit.max()))}
