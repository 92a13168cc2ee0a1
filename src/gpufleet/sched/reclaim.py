"""Which loaned servers to give back when the inference cluster asks for some: Aryl's reclaiming step.

When inference load rises, the training scheduler must return ``count`` of the whole servers it borrowed.
Returning a server removes every training worker on it. An elastic job that loses only flexible workers
(those above its base demand) scales in; a job pushed below its base demand, and any inelastic job that
loses a worker, must be preempted. Aryl picks servers greedily by their *server preemption cost* so as to
preempt few jobs. This module holds that choice as pure functions over a :class:`ReclaimInstance`:

- :func:`preempted_jobs`: the jobs a set of returned servers forces to be preempted (the exact checker);
- :func:`pick_servers`: the reclaiming rules, by name (:data:`RECLAIM_METHODS`);
- :func:`brute_force_min_preemptions`: the exact optimum on small instances, for tests.

Finding the fewest preemptions is NP-hard in general; the "cost" greedy is Aryl's heuristic for it (our
reconstruction: the paper body is unavailable, see the research notes on Aryl).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from gpufleet.errors import ConfigError

__all__ = [
    "RECLAIM_METHODS",
    "RECLAIM_WEIGHTS",
    "ReclaimInstance",
    "brute_force_min_preemptions",
    "pick_servers",
    "preempted_jobs",
]

#: names accepted by :func:`pick_servers` as ``method``
RECLAIM_METHODS = ("cost", "random", "fewest-jobs")
#: names accepted by :func:`pick_servers` as ``weight`` (what one preempted job costs)
RECLAIM_WEIGHTS = ("jobs", "gpus", "lost")

#: brute force enumerates subsets; beyond this many servers it would take too long
MAX_BRUTE_FORCE_SERVERS = 20


@dataclass(frozen=True)
class ReclaimInstance:
    """The loaned servers that may be returned and the training workers placed on them.

    ``workers`` counts each job's workers on all servers (training servers included), so a job can lose its
    workers on loaned servers and keep running on the rest. ``min_workers`` is its base demand; an inelastic
    job has ``min_workers == workers``. A worker is assumed to be one unit of ``on_server``; ``gpus_used``
    and ``lost_work`` only break ties (and ``lost_work`` can weight the cost).
    """

    servers: tuple[int, ...]  # loaned server ids that may be returned
    on_server: Mapping[int, Mapping[int, int]]  # server -> {job: workers of that job on it}
    workers: Mapping[int, int]  # job -> current workers (all servers, loaned or not)
    min_workers: Mapping[int, int]  # job -> base demand (inelastic: == workers)
    gpus_used: Mapping[int, int]  # server -> GPUs in use on it (tie-break)
    lost_work: Mapping[int, float] = field(default_factory=dict)  # job -> work lost if preempted now

    def __post_init__(self) -> None:
        """Reject inconsistent instances: duplicate servers, unknown jobs, or more workers placed than exist."""
        if len(set(self.servers)) != len(self.servers):
            raise ValueError(f"duplicate server ids in servers: {sorted(self.servers)}")
        placed: dict[int, int] = {}
        for s, jobs in self.on_server.items():
            for j, n in jobs.items():
                if j not in self.workers or j not in self.min_workers:
                    raise ValueError(f"job {j} on server {s} is missing from workers or min_workers")
                if n < 0:
                    raise ValueError(f"server {s} holds a negative number of workers ({n}) of job {j}")
                placed[j] = placed.get(j, 0) + n
        for j, n in placed.items():
            if n > self.workers[j]:
                raise ValueError(f"job {j} has {n} workers placed on servers but only {self.workers[j]} in all")
        for j, w in self.workers.items():
            m = self.min_workers.get(j)
            if m is None or not 0 <= m <= w:
                raise ValueError(f"job {j}: min_workers {m} must lie between 0 and its workers {w}")

    def jobs_on(self, server: int) -> Mapping[int, int]:
        """The ``{job: workers}`` on ``server`` (empty for a server that hosts nothing)."""
        return self.on_server.get(server, {})


def preempted_jobs(inst: ReclaimInstance, returned: Iterable[int]) -> set[int]:
    """Jobs whose workers left after the servers are returned fall below their base demand (they must be preempted).

    A job counts once however many of the returned servers it spans. A job that loses only flexible workers
    (it keeps at least ``min_workers``) scales in and is not listed; an inelastic job that loses any worker is.
    Raises ValueError if a returned server is not one of ``inst.servers``.
    """
    chosen = set(returned)
    unknown = chosen - set(inst.servers)
    if unknown:
        raise ValueError(f"servers {sorted(unknown)} are not loaned servers of this instance")
    removed: dict[int, int] = {}
    for s in chosen:
        for j, n in inst.jobs_on(s).items():
            removed[j] = removed.get(j, 0) + n
    return {j for j, n in removed.items() if n > 0 and inst.workers[j] - n < inst.min_workers[j]}


def _job_weight(inst: ReclaimInstance, weight: str) -> Mapping[int, float] | None:
    """What one preempted job costs under ``weight``: None for 1 each ("jobs"), else a job -> cost mapping."""
    if weight == "jobs":
        return None
    if weight == "gpus":
        return {j: float(w) for j, w in inst.workers.items()}
    if weight == "lost":
        return {j: float(inst.lost_work.get(j, 0.0)) for j in inst.workers}
    raise ConfigError(f"unknown reclaim weight {weight!r}; choose one of {', '.join(RECLAIM_WEIGHTS)}")


class _CostGreedy:
    """State of the "cost" greedy: each job's remaining workers, who is preempted, and a heap of server keys.

    A server's key is ``(cost, gpus used, lost work of the jobs it would newly preempt, server id)``; the
    smallest key is returned next. Returning a server changes only the jobs on it, so only the servers that
    share a job with it get new keys; stale heap entries are skipped by comparing with the current key.
    """

    def __init__(self, inst: ReclaimInstance, weight: str) -> None:
        self.inst = inst
        self.cost_of = _job_weight(inst, weight)
        self.remaining = dict(inst.workers)
        self.preempted: set[int] = set()
        self.left = set(inst.servers)
        self.servers_of: dict[int, list[int]] = {}
        for s in inst.servers:
            for j, n in inst.jobs_on(s).items():
                if n > 0:
                    self.servers_of.setdefault(j, []).append(s)
        self.key = {s: self._key(s) for s in inst.servers}
        self.heap = [(k, s) for s, k in self.key.items()]
        heapq.heapify(self.heap)

    def _key(self, s: int) -> tuple[float, int, float, int]:
        """The current ordering key of server ``s`` given the servers returned so far."""
        inst = self.inst
        cost = lost = 0.0
        for j, n in inst.jobs_on(s).items():
            if n > 0 and j not in self.preempted and self.remaining[j] - n < inst.min_workers[j]:
                cost += 1.0 if self.cost_of is None else self.cost_of[j]
                lost += inst.lost_work.get(j, 0.0)
        return cost, inst.gpus_used.get(s, 0), lost, s

    def pop(self) -> int:
        """Return the cheapest remaining server, apply its removal, and rekey the servers it affects."""
        while True:
            k, s = heapq.heappop(self.heap)
            if s in self.left and self.key[s] == k:
                break
        self.left.discard(s)
        touched: set[int] = set()
        for j, n in self.inst.jobs_on(s).items():
            if n <= 0 or j in self.preempted:
                continue
            self.remaining[j] -= n
            if self.remaining[j] < self.inst.min_workers[j]:
                self.preempted.add(j)  # gang-preempted: its workers elsewhere no longer matter
            touched.update(self.servers_of[j])
        for t in touched & self.left:
            k = self._key(t)
            if k != self.key[t]:
                self.key[t] = k
                heapq.heappush(self.heap, (k, t))
        return s


def _pick_by_cost(inst: ReclaimInstance, count: int, weight: str) -> list[int]:
    """Aryl's greedy: return the server of least current preemption cost, ``count`` times, recomputing costs."""
    greedy = _CostGreedy(inst, weight)
    return [greedy.pop() for _ in range(count)]


def _pick_fewest_jobs(inst: ReclaimInstance, count: int) -> list[int]:
    """A static ranking: servers hosting the fewest distinct jobs, then fewest GPUs used, then smallest id."""

    def rank(s: int) -> tuple[int, int, int]:
        return sum(1 for n in inst.jobs_on(s).values() if n > 0), inst.gpus_used.get(s, 0), s

    return sorted(inst.servers, key=rank)[:count]


def pick_servers(
    inst: ReclaimInstance, count: int, method: str = "cost", *, seed: int = 0, weight: str = "jobs"
) -> list[int]:
    """Choose ``count`` loaned servers to return, in the order they are picked.

    Methods (:data:`RECLAIM_METHODS`):

    - ``"cost"`` (Aryl): ``count`` times, return the server whose *current* preemption cost is least: the
      jobs it would newly preempt given the servers already picked (a job already preempted costs nothing;
      an elastic job that has lost flexible workers may now sit at its base demand and cost one). A job
      costs 1 (``weight="jobs"``), its workers (``"gpus"``, one GPU per worker), or its ``lost_work``
      (``"lost"``). Ties: fewest GPUs used, then least lost work of the newly preempted jobs, then smallest
      server id. Costs are recomputed after each pick, only for servers sharing a job with the picked one.
    - ``"random"``: ``count`` distinct servers uniformly at random, from ``numpy.random.default_rng(seed)``.
    - ``"fewest-jobs"``: the servers hosting the fewest distinct jobs (ties: fewest GPUs used, then id), a
      static ranking with no recomputation; it resembles DeepBoot's rule of returning the servers with the
      fewest training GPUs first.

    Raises ConfigError for an unknown method or weight, ValueError if ``count`` is negative or exceeds the
    number of loaned servers.
    """
    if method not in RECLAIM_METHODS:
        raise ConfigError(f"unknown reclaim method {method!r}; choose one of {', '.join(RECLAIM_METHODS)}")
    if weight not in RECLAIM_WEIGHTS:
        raise ConfigError(f"unknown reclaim weight {weight!r}; choose one of {', '.join(RECLAIM_WEIGHTS)}")
    if not 0 <= count <= len(inst.servers):
        raise ValueError(f"cannot return {count} servers: {len(inst.servers)} are on loan")
    if count == 0:
        return []
    if method == "cost":
        return _pick_by_cost(inst, count, weight)
    if method == "random":
        rng = np.random.default_rng(seed)
        return [inst.servers[i] for i in rng.choice(len(inst.servers), size=count, replace=False)]
    return _pick_fewest_jobs(inst, count)


def brute_force_min_preemptions(inst: ReclaimInstance, count: int) -> tuple[int, tuple[int, ...]]:
    """The exact minimum number of preempted jobs over all sets of ``count`` servers, and the first such set.

    Enumerates every subset of the sorted server ids (for tests of the greedy); refuses instances with more
    than 20 loaned servers with ValueError.
    """
    if len(inst.servers) > MAX_BRUTE_FORCE_SERVERS:
        raise ValueError(
            f"brute force over {len(inst.servers)} servers is too slow; at most {MAX_BRUTE_FORCE_SERVERS} allowed"
        )
    if not 0 <= count <= len(inst.servers):
        raise ValueError(f"cannot return {count} servers: {len(inst.servers)} are on loan")
    best: tuple[int, tuple[int, ...]] | None = None
    for subset in itertools.combinations(sorted(inst.servers), count):
        n = len(preempted_jobs(inst, subset))
        if best is None or n < best[0]:
            best = (n, subset)
            if n == 0:
                break
    assert best is not None  # combinations always yields at least one subset for 0 <= count <= len
    return best
