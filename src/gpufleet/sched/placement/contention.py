"""``contention``: the hand-written network-aware heuristic (docs/contention.md)."""

from __future__ import annotations

from typing import Any, ClassVar

from gpufleet.sched.placement.base import register
from gpufleet.sched.placement.candidates import CandidatePlacement, least_cost


@register
class ContentionPlacement(CandidatePlacement):
    """Consolidate when a node fits; otherwise the candidate that costs least GPU-throughput, counting the job's
    own slowdown (placement and contention) and the speed it takes from the jobs whose links it would share.
    ``wait_below`` > 0 holds a job whose best speed is below it while something runs (an event will come)."""

    name = "contention"
    summary = "network-aware: consolidate, else the node set whose links carry the least competing traffic"
    needs: ClassVar[frozenset[str]] = frozenset({"network"})
    options: ClassVar[dict[str, float | str]] = {"wait_below": 0.0}

    def place(self, j: int, p: int, part: Any) -> Any:
        """A job that fits on one node goes to the best-fit node at once: one node uses no link, runs at full
        speed (spreading never beats the fewest nodes) and takes nothing from others, so it costs 0, the least
        any candidate can, and ties go to the first slot, the same node. Only the others build the candidates."""
        g = self.sim.gpus[j]
        if g <= part.gpus_per_node and g <= part.total_free and float(self.opts["wait_below"]) <= 1.0:
            node = part._best_fit_node(g)
            if node is not None:
                self.waited = False
                return part.take([(node, g)])
        return super().place(j, p, part)

    def choose(self, j: int, p: int, part: Any, cands: list) -> int | None:
        best, speed = least_cost(self.scores(j, p, cands), self.sim.gpus[j])
        if best is not None and speed < float(self.opts["wait_below"]) and self.sim.n_running > 0 and self.may_wait:
            return None
        return best
