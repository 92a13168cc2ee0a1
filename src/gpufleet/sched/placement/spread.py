"""``spread``: the DeepShare paper's baseline placement, spread over as many nodes as an even split allows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.sched.candidates import spread_placement
from gpufleet.sched.placement.base import Placement, register

if TYPE_CHECKING:
    from gpufleet.sched.view import Allocation, PartitionView


@register
class Spread(Placement):
    """Up to 4 nodes (never one unless nothing else fits), best fit within the shape; uneven fallback last."""

    name = "spread"
    summary = "spread-first over up to 4 nodes, as the DeepShare paper's baselines place jobs"

    def place(self, j: int, p: int, part: PartitionView) -> Allocation | None:
        alloc = spread_placement(part, self.sim.gpus[j], unit=self.sim.worker_gpus(j))
        return None if alloc is None else part.take(alloc)
