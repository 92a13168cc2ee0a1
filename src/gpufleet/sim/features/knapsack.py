"""Elastic scaling as an engine feature: knapsack rounds that hand the GPUs left over to elastic jobs' extra
workers (Aryl's phase 2). A round comes every ``interval_s``; it is skipped when nothing changed since the
last one. Switched off (no feature), every job runs with its base demand only."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpufleet.sim.features.base import Feature
from gpufleet.sim.scaling import PowerLawCurve
from gpufleet.sim.servers import LOANED, TRAINING


class KnapsackRounds(Feature):
    """Every ``interval_s``, resize the running elastic jobs through the policy's knapsack (``extra_workers``)."""

    name = "elastic-scaling"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.next_round = math.inf
        self.dirty = True  # something changed since the last round
        self._last_round: set[int] = set()

    def bind(self, sim: Any) -> None:
        super().bind(sim)
        self.next_round = (sim.submit[0] if sim.n else 0.0) + self.interval_s

    def wake_time(self) -> float:
        return self.next_round

    def end_pass(self, now: float) -> None:
        self.dirty = True

    def end_step(self, now: float) -> None:
        if now >= self.next_round:
            if self.dirty:
                self._phase2(now)
                self.dirty = False
            self.next_round = now + self.interval_s

    def _phase2(self, now: float) -> None:
        """Knapsack round: leftover GPUs to elastic running jobs' extra workers."""
        sim = self.sim
        srv = sim.srv
        cand = [j for j in sim.running if sim.wmax[j] > sim.wmin[j]]
        if not cand:
            return
        free_train = srv.free_in[TRAINING] + srv.flex_in[TRAINING]
        free_loan = srv.free_in[LOANED] + srv.flex_in[LOANED] if sim.loans else 0
        capacity = free_train + free_loan
        if capacity <= 0:
            return
        # Nothing to hand out and no newcomer to hand it to: no GPU is free for another worker of any job below
        # its maximum, and every candidate already took part in the last solve. The allocation chosen then
        # stands (its values only drift as remaining times shrink), so the round is skipped.
        free_now = srv.free_in[TRAINING] + (srv.free_in[LOANED] if sim.loans else 0)
        newcomers = any(j not in self._last_round for j in cand)
        if not newcomers and all(free_now < sim.g[j] or sim.nflex[j] >= sim.wmax[j] - sim.wmin[j] for j in cand):
            return
        factor = (free_train + sim.loan_speed * free_loan) / capacity
        rows = np.array(
            [
                (
                    sim.g[j],
                    sim.nflex[j],
                    sim.wmax[j] - sim.wmin[j],
                    sim.remaining[j] - sim.progress_now(j, now),
                    sim.rate[j],
                    sim.eff[j] - sim.eff_flex[j],
                    sim.wmin[j],
                )
                for j in cand
            ]
        )
        g = rows[:, 0].astype(np.int64)
        extra_now = rows[:, 1].astype(np.int64)
        extra_max = np.maximum(np.minimum(rows[:, 2].astype(np.int64), capacity // g), extra_now)
        choice = sim.policy.extra_workers(
            rows[:, 3],
            rows[:, 4],
            rows[:, 5],
            rows[:, 6],
            extra_now,
            extra_max,
            g,
            capacity,
            factor,
            sim.ecfg.scale_pause_s,
            self._throughput_rows(cand),
        )
        self._last_round = set(cand)
        changed: set[int] = set()
        # shrink first (training servers first, so flexible workers stay on loaned servers)
        for j, k in zip(cand, choice.tolist(), strict=True):
            if k < sim.nflex[j]:
                sim._close_segment(j, now)
                self._drop_flex(j, sim.nflex[j] - k)
                changed.add(j)
        # then grow, biggest workers first (best-fit decreasing), loaned servers first
        grow = sorted(
            (j for j, k in zip(cand, choice.tolist(), strict=True) if k > sim.nflex[j]), key=lambda x: (-sim.g[x], x)
        )
        want = dict(zip(cand, choice.tolist(), strict=True))
        for j in grow:
            need = want[j] - sim.nflex[j]
            places = srv.best_fit_many(sim.g[j], need, sim._mask(j, True) & (srv.group == LOANED)) if sim.loans else []
            if len(places) < need:
                places += srv.best_fit_many(sim.g[j], need - len(places), sim._mask(j, False))
            if not places:
                continue
            sim._close_segment(j, now)
            for s in places:
                sim._put(s, j, True)
            changed.add(j)
        for j in changed:
            sim._rescaled(j, now)

    def _throughput_rows(self, cand: list[int]):
        """``f(w)`` for a matrix ``w`` with one row per candidate job: each row through that job's curve."""
        sim = self.sim
        curves = [sim.curve_of[j] for j in cand]
        alpha = {c.alpha for c in curves if isinstance(c, PowerLawCurve)}
        if len(alpha) == 1 and all(isinstance(c, PowerLawCurve) for c in curves):
            a = alpha.pop()
            return lambda w: np.where(w > 0, np.maximum(w, 0.0) ** a, 0.0)

        def per_row(w: np.ndarray) -> np.ndarray:
            return np.array([[c.throughput(float(x)) for x in row] for c, row in zip(curves, w, strict=True)])

        return per_row

    def _drop_flex(self, j: int, count: int) -> None:
        """Remove ``count`` flexible workers of ``j``: training servers first, then loaned ones."""
        sim = self.sim
        srv = sim.srv
        order = sorted(sim.where[j], key=lambda s: (srv.group[s] != TRAINING, s))
        for s in order:
            while count and srv.occ[s].get(j, (0, 0))[1] > 0:
                sim._take(s, j, True)
                count -= 1
            if not count:
                return
