"""Aryl (Lyra, EuroSys'23): loan idle inference servers to training and scale elastic jobs onto spare GPUs.

The event core with its server-level placement (``sim.elastic``) executes; these policies decide:
- phase 1 orders waiting jobs shortest first and admits each one's base demand when it fits;
- phase 2 hands the GPUs left over to elastic jobs by a multiple-choice knapsack whose value is the
  reduction of each job's remaining time that extra workers buy (net of the pause a rescale costs);
- reclaiming picks the loaned servers to return by server preemption cost (``gpufleet.sched.reclaim``).
Four names switch the two mechanisms on and off: ``aryl`` (both), ``aryl-loan``, ``aryl-elastic`` and
``aryl-base`` (neither: Aryl's own SJF and placement on the training pool alone).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.sched.knapsack import greedy_mckp, solve, solve_mckp
from gpufleet.sched.policy import Policy, register
from gpufleet.sched.reclaim import RECLAIM_METHODS, RECLAIM_WEIGHTS, ReclaimInstance, pick_servers

SOLVERS = ("auto", "dp", "greedy")


class ArylPolicy(Policy):
    """The Aryl family; subclasses set whether servers are loaned and whether jobs scale."""

    engine: ClassVar[str] = "elastic"
    loan: ClassVar[bool] = True
    elastic: ClassVar[bool] = True
    options: ClassVar[dict[str, float | str]] = {"reclaim": "cost", "solver": "auto", "reclaim_weight": "jobs"}

    def __init__(self, **opts: object) -> None:
        super().__init__(**opts)
        if self.opts["reclaim"] not in RECLAIM_METHODS:
            raise ConfigError(f"reclaim='{self.opts['reclaim']}' is not one of {', '.join(RECLAIM_METHODS)}")
        if self.opts["solver"] not in SOLVERS:
            raise ConfigError(f"solver='{self.opts['solver']}' is not one of {', '.join(SOLVERS)}")
        if self.opts["reclaim_weight"] not in RECLAIM_WEIGHTS:
            raise ConfigError(
                f"reclaim_weight='{self.opts['reclaim_weight']}' is not one of {', '.join(RECLAIM_WEIGHTS)}"
            )

    # -- phase 1 ---------------------------------------------------------------------------------
    def waiting_key(self, j: int, now: float) -> float:
        """Shortest (remaining) job first, by the oracle duration at base demand."""
        return self.sim.remaining[j]

    # -- phase 2 ---------------------------------------------------------------------------------
    def extra_workers(
        self,
        remaining: np.ndarray,
        rate_now: np.ndarray,
        base_eff: np.ndarray,
        base_workers: np.ndarray,
        extra_now: np.ndarray,
        extra_max: np.ndarray,
        gpus_per_worker: np.ndarray,
        capacity: int,
        speed_factor: float,
        pause_s: float,
        throughput: Callable[[np.ndarray], np.ndarray],
    ) -> np.ndarray:
        """Extra workers per candidate job, by the multiple-choice knapsack over JCT reduction.

        Job ``i`` runs ``remaining[i]`` seconds of base-demand work at ``rate_now[i]`` (1 = its base demand on
        training GPUs). With ``k`` extra workers of speed ``speed_factor`` its rate becomes
        ``T(base_eff + k f) / T(base_workers)``, where ``throughput`` maps a matrix with one row per job
        through that job's curve; the item's value is the remaining time saved against now,
        minus ``pause_s`` when ``k`` differs from ``extra_now`` (a rescale pauses the job). Item ``k`` weighs
        ``k * gpus_per_worker`` GPUs; the items of all jobs share ``capacity`` GPUs.
        """
        n = len(remaining)
        choice = np.zeros(n, dtype=np.int64)
        if n == 0:
            return choice
        # one row per job, one column per extra-worker count; columns past a job's maximum are masked out
        kmax = int(extra_max.max())
        ks = np.arange(kmax + 1, dtype=np.float64)
        eff = base_eff[:, None] + ks[None, :] * speed_factor
        rate = throughput(eff) / throughput(base_workers[:, None])
        now_time = remaining / np.maximum(rate_now, 1e-12)
        value = now_time[:, None] - remaining[:, None] / np.maximum(rate, 1e-12) - pause_s
        rows = np.arange(n)
        value[rows, extra_now] = 0.0
        valid = ks[None, :] <= extra_max[:, None]
        value = np.where(valid, value, -np.inf)
        weight = ks[None, :].astype(np.int64) * gpus_per_worker[:, None]
        # exact fast path: when every job's own best count fits together, that is the optimum
        best = np.argmax(value, axis=1)
        if int(weight[rows, best].sum()) <= capacity:
            return best.astype(np.int64)
        live = np.flatnonzero(extra_max > 0)
        values = [value[i, : int(extra_max[i]) + 1] for i in live]
        weights = [weight[i, : int(extra_max[i]) + 1] for i in live]
        solver = self.opts["solver"]
        if solver == "dp":
            _, picked = solve_mckp(values, weights, capacity, check=False)
        elif solver == "greedy":
            _, picked = greedy_mckp(values, weights, capacity)
        else:
            _, picked = solve(values, weights, capacity, check=False)
        choice[live] = picked
        return np.asarray(choice, dtype=np.int64)

    # -- reclaiming ------------------------------------------------------------------------------
    def servers_to_return(self, instance: ReclaimInstance, count: int, seed: int) -> list[int]:
        """The ``count`` loaned servers to give back to inference, by the ``reclaim`` option's method."""
        return pick_servers(
            instance, count, str(self.opts["reclaim"]), seed=seed, weight=str(self.opts["reclaim_weight"])
        )


@register
class Aryl(ArylPolicy):
    """Capacity loaning and elastic scaling together."""

    name = "aryl"
    summary = "Aryl: SJF + knapsack over elastic workers, loans idle inference servers, reclaims by cost"


@register
class ArylLoan(ArylPolicy):
    """Capacity loaning without elastic scaling: inelastic jobs may run on loaned servers."""

    name = "aryl-loan"
    summary = "Aryl ablation: loans idle inference servers, no elastic scaling"
    elastic = False


@register
class ArylElastic(ArylPolicy):
    """Elastic scaling on the training pool alone."""

    name = "aryl-elastic"
    summary = "Aryl ablation: elastic scaling on the training pool, no loaning"
    loan = False


@register
class ArylBase(ArylPolicy):
    """Neither mechanism: Aryl's SJF and best-fit-decreasing placement on the training pool."""

    name = "aryl-base"
    summary = "Aryl ablation: SJF with best-fit-decreasing placement, no loaning, no elastic scaling"
    loan = False
    elastic = False
