"""Loaning and reclaiming as an engine feature: the inference pool's load over time decides how many of its
servers training may borrow; when the load rises again, servers are reclaimed (the policy picks which) and a
job that loses part of its base demand goes back to the queue from its last checkpoint (Aryl).

With loaning switched off (``loan`` False) the feature only follows the load, for the timeline."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpufleet.sched.reclaim import ReclaimInstance
from gpufleet.sim.features.base import Feature
from gpufleet.sim.features.inference import held_schedule
from gpufleet.sim.servers import HELD, LOANED


class InferenceLoans(Feature):
    """Follows ``load`` (servers the inference service needs over time), with ``notice_s`` of reclaim notice."""

    name = "loaning"

    def __init__(self, load: Any, notice_s: float) -> None:
        times, values = held_schedule(
            np.asarray(load.time_s, dtype=np.float64), np.asarray(load.servers, dtype=np.int64), notice_s
        )
        self._t: list[float] = times.tolist()
        self._v: list[int] = values.tolist()
        self._i = 0

    def next_time(self) -> float:
        return self._t[self._i] if self._i < len(self._t) else math.inf

    def apply(self, now: float) -> float:
        lt, lv = self._t, self._v
        while self._i < len(lt) and lt[self._i] <= now:
            self._apply_load(lv[self._i], now)
            self._i += 1
        return self.next_time()

    def _apply_load(self, servers_needed: int, now: float) -> None:
        sim = self.sim
        srv = sim.srv
        pool = len(srv.inference_ids)
        sim.inf_needed = servers_needed
        target = max(0, pool - servers_needed) if sim.loans else 0
        loaned = srv.loaned
        if len(loaned) < target:
            held = srv.inference_ids[srv.group[srv.inference_ids] == HELD]
            take = held[::-1][: target - len(loaned)]
            sim._move(take, LOANED)
        elif len(loaned) > target:
            self._reclaim(loaned, len(loaned) - target, now)

    def _reclaim(self, loaned: np.ndarray, count: int, now: float) -> None:
        sim = self.sim
        srv = sim.srv
        if sim.policy.opts["reclaim"] != "random":
            # idle loaned servers cost nothing and use no GPUs: the cost greedy and fewest-jobs both return
            # them first, lowest id first, so they go back without building the full instance
            empty = loaned[srv.free[loaned] == srv.cap[loaned]][:count]
            if len(empty):
                sim.counters["reclaims"] += len(empty)
                sim._move(empty, HELD)
                count -= len(empty)
                loaned = loaned[srv.group[loaned] == LOANED]
            if count <= 0:
                return
        on_server = {int(s): {j: b + f for j, (b, f) in srv.occ[s].items()} for s in loaned}
        jobs = {j for occ in on_server.values() for j in occ}
        lost = {}
        for j in jobs:
            done = sim.duration[j] - sim.remaining[j] + sim.progress_now(j, now)
            lost[j] = (done - sim._checkpointed(j, done)) * sim.gpus[j]
        inst = ReclaimInstance(
            servers=tuple(int(s) for s in loaned),
            on_server=on_server,
            workers={j: sim.nbase[j] + sim.nflex[j] for j in jobs},
            min_workers={j: sim.wmin[j] for j in jobs},
            gpus_used={int(s): int(srv.cap[s] - srv.free[s]) for s in loaned},
            lost_work=lost,
        )
        back = sim.policy.servers_to_return(inst, count, seed=sim.ecfg.seed + sim.counters["reclaims"])
        sim.counters["reclaims"] += len(back)
        hit: set[int] = set()
        for s in back:
            for j in list(srv.occ[s]):
                if j not in hit:
                    sim._close_segment(j, now)
                    hit.add(j)
                sim._take_all_on(s, j)
            sim._move(np.array([s]), HELD)
        for j in sorted(hit):
            if sim.nbase[j] + sim.nflex[j] < sim.wmin[j]:
                self._preempt(j, now)
            else:
                self._rebalance_base(j)
                sim._rescaled(j, now)

    def _rebalance_base(self, j: int) -> None:
        """After losing base workers, make flexible workers elsewhere base workers again."""
        sim = self.sim
        srv = sim.srv
        for s in sim.where[j]:
            while sim.nbase[j] < sim.wmin[j] and srv.occ[s][j][1] > 0:
                srv.flex_to_base(s, j, sim.g[j])
                sim.nflex[j] -= 1
                sim.nbase[j] += 1
                sim.eff_flex[j] -= float(srv.speed[s])

    def _preempt(self, j: int, now: float) -> None:
        """A reclaim took part of job ``j``'s base demand: back to the queue from its last checkpoint (with
        notice, the job checkpoints before its servers go)."""
        sim = self.sim
        sim.evict(j, now, lossy=sim.ecfg.reclaim_notice_s <= 0, preempted=True)
        sim.counters["reclaim_preemptions"] += 1
