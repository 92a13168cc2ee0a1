"""``consolidate``: fewest nodes, best fit (the default); the engine's own placement for the Aryl policies."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.sched.placement.base import Placement, register

if TYPE_CHECKING:
    from gpufleet.sched.view import Allocation, PartitionView


@register
class Consolidate(Placement):
    """The run's GPU allocation setting (``SimConfig.placement``: fewest nodes with best fit by default)."""

    name = "consolidate"
    summary = "fewest nodes, best fit (default); Aryl's server-level best fit on the elastic engine"
    gpu_level = False

    def place(self, j: int, p: int, part: PartitionView) -> Allocation | None:
        return self.allocate_as_configured(j, part)
