"""``random``: a uniformly random feasible candidate node set, the ablation every placement table shows."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from gpufleet.sched.placement.base import register
from gpufleet.sched.placement.candidates import CandidatePlacement


@register
class RandomPlacement(CandidatePlacement):
    """What placement gains without any knowledge (same candidates and code path as ``rl``)."""

    name = "random"
    summary = "ablation: a uniformly random feasible candidate node set (same code path as rl)"
    needs: ClassVar[frozenset[str]] = frozenset({"network"})
    options: ClassVar[dict[str, float | str]] = {"seed": 0.0}
    deterministic = False

    def bind(self, sim: Any) -> None:
        super().bind(sim)
        self._rng = np.random.default_rng(int(self.opts["seed"]))

    def choose(self, j: int, p: int, part: Any, cands: list) -> int | None:
        valid = [i for i, c in enumerate(cands) if c is not None]
        return int(valid[self._rng.integers(len(valid))])
