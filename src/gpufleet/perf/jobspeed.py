"""Job speed for the simulator: how fast a training job runs on a given GPU count and placement.

The simulator asks, for a job of ``gpus`` GPUs placed on ``nodes`` nodes, for its throughput relative
to the same job packed onto as few nodes as possible. ``JobSpeedModel`` answers from the performance
model (best layout found by the planner for that placement) and caches every answer, so a simulation
with millions of placements calls the planner once per distinct (gpus, nodes) pair.
"""

from __future__ import annotations

import functools
import math

from gpufleet.errors import ConfigError
from gpufleet.perf.efficiency import Efficiency, jobspeed_efficiency
from gpufleet.perf.model_spec import ModelSpec
from gpufleet.perf.options import TrainOptions
from gpufleet.perf.planner import plan_layouts
from gpufleet.perf.system import System

__all__ = ["JobSpeedModel"]


class JobSpeedModel:
    """Cached throughput of one model on one kind of node, as a function of GPU count and placement.

    ``tokens_per_gpu_batch`` sets the global batch as GPUs grow (weak scaling, ``gbs = gpus x
    tokens_per_gpu_batch / seq`` rounded to a multiple of the DP size the planner chooses). Without
    ``efficiency`` it runs on the frozen job-speed constants (``jobspeed_efficiency``), not on the
    refittable validation constants, so simulated speeds stay put when ``perf calibrate`` moves those.
    """

    def __init__(
        self,
        model: ModelSpec,
        system: System,
        tokens_per_gpu_batch: int = 16384,
        options: TrainOptions | None = None,
        efficiency: Efficiency | None = None,
    ) -> None:
        self.model = model
        self.system = system
        self.tokens_per_gpu_batch = tokens_per_gpu_batch
        self.options = options
        self.efficiency = efficiency or jobspeed_efficiency()
        self._throughput = functools.lru_cache(maxsize=4096)(self._compute)

    def _compute(self, gpus: int, nodes: int) -> float:
        per_node = math.ceil(gpus / nodes)
        # the job's GPUs on each node get their share of that node's NICs
        nic_share = max(self.system.nics_per_node * per_node / self.system.gpus_per_node, 1e-3)
        placed = System(
            self.system.gpu,
            self.system.nic,
            per_node,
            nic_share,  # type: ignore[arg-type]
            self.system.rack_gpus,
            self.system.oversubscription,
        )
        gbs = max(1, gpus * self.tokens_per_gpu_batch // self.model.seq)
        gbs = max(2 ** int(math.log2(gbs)) if gbs > 1 else 1, gpus)
        try:
            plan = plan_layouts(
                self.model, placed, gpus, gbs, options=self.options, efficiency=self.efficiency, top=1, max_cp=1
            )
        except ConfigError:
            return 0.0
        if plan.table.is_empty():  # nothing fits in memory
            return 0.0
        row = plan.table.row(0, named=True)
        return float(gbs * self.model.seq / row["step_time_s"])

    def throughput(self, gpus: int, nodes: int | None = None) -> float:
        """Tokens per second on ``gpus`` GPUs over ``nodes`` nodes (default: packed); 0 if nothing fits."""
        if gpus < 1:
            raise ConfigError("a job needs at least one GPU")
        packed = math.ceil(gpus / self.system.gpus_per_node)
        return self._throughput(int(gpus), int(max(nodes or packed, packed)))

    def relative_speed(self, gpus: int, nodes: int) -> float:
        """Throughput on ``nodes`` nodes over throughput packed: 1.0 for a packed job, < 1 when spread."""
        packed = self.throughput(gpus)
        return self.throughput(gpus, nodes) / packed if packed > 0 else 0.0

    def cache_info(self) -> functools._CacheInfo:
        """Hits and misses of the throughput cache."""
        return self._throughput.cache_info()
