"""Throughput of an elastic job as a function of its workers: the curve the Aryl knapsack values workers with.

A curve maps an effective worker count (workers on slower loaned GPUs count for less than one) to
throughput in units of one worker. ``PowerLawCurve`` is the parametric sublinear default, used for
trace jobs that name no model; ``PerfCurve`` asks ``gpufleet.perf`` for a model the catalog knows.
"""

from __future__ import annotations

import functools
import math
from typing import Protocol

from gpufleet.errors import ConfigError


class ScalingCurve(Protocol):
    """Throughput in units of one worker on the job's own GPUs, for ``workers`` effective workers."""

    def throughput(self, workers: float) -> float: ...


class PowerLawCurve:
    """``throughput(w) = w ** alpha``: sublinear data-parallel scaling, one exponent for every job.

    ``alpha = 0.9`` means 8 workers give 6.5x one worker (81 % efficiency) and 32 give 22.6x (71 %), the
    range Pollux and Optimus report for common models when the batch grows with the workers.
    """

    def __init__(self, alpha: float = 0.9) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ConfigError(f"scaling exponent alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha

    def throughput(self, workers: float) -> float:
        return workers**self.alpha if workers > 0 else 0.0


class PerfCurve:
    """Throughput from the performance model: a catalog model trained data-parallel on ``gpus_per_worker`` GPUs
    per worker, one worker per node (the simulator loans whole servers, so workers rarely share one)."""

    def __init__(self, model: str, gpu: str, gpus_per_worker: int, nic: str = "ib-hdr") -> None:
        from gpufleet.perf.jobspeed import JobSpeedModel
        from gpufleet.perf.model_spec import load_model
        from gpufleet.perf.system import System

        system = System.build(gpu=gpu, nic=nic, gpus_per_node=max(8, gpus_per_worker))
        self._speed = JobSpeedModel(load_model(model), system)
        self.g = gpus_per_worker
        self._one = self._speed.throughput(self.g, 1)
        if self._one <= 0:
            raise ConfigError(f"model '{model}' does not fit on {gpus_per_worker} {gpu} GPUs")

    @functools.lru_cache(maxsize=1024)  # noqa: B019 - one curve per job type, a handful per run
    def throughput(self, workers: float) -> float:
        lo = max(1, math.floor(workers))
        t = self._speed.throughput(lo * self.g, lo) / self._one
        if workers == lo or workers < 1:
            return t * min(workers, 1.0) if workers < 1 else t
        hi = self._speed.throughput((lo + 1) * self.g, lo + 1) / self._one
        return t + (hi - t) * (workers - lo)
