"""Server-level state of a two-pool cluster: who holds which GPUs, and which inference servers are on loan.

Every node of every pool is one server. A server belongs to one of three groups: a training server, an
inference server on loan to training, or an inference server held by the inference service. Training jobs
run *workers* of ``g`` GPUs, each on one server; a worker is either part of its job's base demand or a
flexible extra (elastic jobs only). The arrays are NumPy so that the best-fit search over all servers is
one vectorised expression.
"""

from __future__ import annotations

import numpy as np

#: server groups; DOWN: a training server out of service (a failure, a drain), which holds no worker
TRAINING, LOANED, HELD, DOWN = 0, 1, 2, 3
_GROUPS = (TRAINING, LOANED, HELD, DOWN)


class Servers:
    """Free GPUs, flexible GPUs and group of every server, with each server's occupants."""

    def __init__(self, cluster: object, loan_speed: float) -> None:
        caps: list[int] = []
        groups: list[int] = []
        types: list[str] = []
        speed: list[float] = []
        for pool in cluster.pools:  # type: ignore[attr-defined]
            training = pool.kind == "training"
            for _ in range(pool.nodes):
                caps.append(pool.gpus_per_node)
                groups.append(TRAINING if training else HELD)
                types.append(pool.gpu)
                speed.append(1.0 if training else loan_speed)
        self.cap = np.array(caps, dtype=np.int64)
        self.free = self.cap.copy()
        self.flex = np.zeros_like(self.cap)  # GPUs held by flexible workers
        self.group = np.array(groups, dtype=np.int64)
        self.gpu_type = np.array(types, dtype=object)
        self.speed = np.array(speed)
        self.inference_ids = np.flatnonzero(self.group == HELD)
        self.training_gpus = int(self.cap[self.group == TRAINING].sum())
        self.inference_gpus = int(self.cap[self.group == HELD].sum())
        #: free and flexible GPUs per group (TRAINING, LOANED, HELD, DOWN): an O(1) necessary condition for a fit
        self.free_in = [int(self.free[self.group == k].sum()) for k in _GROUPS]
        self.flex_in = [0, 0, 0, 0]
        self.servers_in = [int((self.group == k).sum()) for k in _GROUPS]
        #: server -> {job: [base workers, flexible workers]}
        self.occ: list[dict[int, list[int]]] = [{} for _ in caps]

    def __len__(self) -> int:
        return len(self.cap)

    @property
    def loaned(self) -> np.ndarray:
        """Ids of the servers on loan, ascending."""
        return np.flatnonzero(self.group == LOANED)

    def best_fit(self, g: int, mask: np.ndarray, with_flex: bool) -> int:
        """The server of ``mask`` with the least room that still holds ``g`` GPUs (room counts flexible GPUs
        when ``with_flex``); lowest id on ties, -1 if none."""
        room = self.free + self.flex if with_flex else self.free
        ok = mask & (room >= g)
        if not ok.any():
            return -1
        cand = np.flatnonzero(ok)
        return int(cand[np.argmin(room[cand])])

    def best_fit_many(self, g: int, count: int, mask: np.ndarray) -> list[int]:
        """Servers for up to ``count`` workers of ``g`` GPUs by repeated best fit over free GPUs, in one sort.

        Best fit for identical workers keeps filling the tightest server that still holds one, so it is the
        servers with room sorted by room (then id), each filled as far as it goes. Returns one id per worker.
        """
        ok = np.flatnonzero(mask & (self.free >= g))
        if not ok.size or count <= 0:
            return []
        room = self.free[ok]
        order = np.lexsort((ok, room))
        out: list[int] = []
        for s, r in zip(ok[order].tolist(), room[order].tolist(), strict=True):
            take = min(r // g, count - len(out))
            out.extend([s] * take)
            if len(out) == count:
                break
        return out

    def slots(self, g: int, mask: np.ndarray, with_flex: bool) -> int:
        """How many workers of ``g`` GPUs fit on the servers of ``mask`` (exact for identical workers)."""
        room = self.free + self.flex if with_flex else self.free
        return int((room[mask] // g).sum())

    def add(self, s: int, j: int, g: int, flexible: bool) -> None:
        """Put one worker of job ``j`` (``g`` GPUs) on server ``s``."""
        self.free[s] -= g
        k = self.group[s]
        self.free_in[k] -= g
        entry = self.occ[s].setdefault(j, [0, 0])
        if flexible:
            entry[1] += 1
            self.flex[s] += g
            self.flex_in[k] += g
        else:
            entry[0] += 1
        assert self.free[s] >= 0, "server over-allocated"

    def remove(self, s: int, j: int, g: int, flexible: bool) -> None:
        """Take one worker of job ``j`` off server ``s``."""
        entry = self.occ[s][j]
        k = self.group[s]
        if flexible:
            entry[1] -= 1
            self.flex[s] -= g
            self.flex_in[k] -= g
        else:
            entry[0] -= 1
        self.free[s] += g
        self.free_in[k] += g
        if entry[0] == 0 and entry[1] == 0:
            del self.occ[s][j]

    def move(self, servers: np.ndarray, group: int) -> None:
        """Move empty ``servers`` (just loaned, returned, gone down or back up) to ``group``."""
        for s in servers.tolist():
            assert self.free[s] == self.cap[s], "only an empty server changes hands"
            self.free_in[self.group[s]] -= int(self.cap[s])
            self.servers_in[self.group[s]] -= 1
            self.group[s] = group
            self.free_in[group] += int(self.cap[s])
            self.servers_in[group] += 1

    def flex_to_base(self, s: int, j: int, g: int) -> None:
        """Count one flexible worker of job ``j`` on ``s`` as a base worker from now on."""
        self.occ[s][j][1] -= 1
        self.occ[s][j][0] += 1
        self.flex[s] -= g
        self.flex_in[self.group[s]] -= g

    def check(self) -> None:
        """Raise AssertionError if free and flexible GPUs disagree with the occupants (debug mode)."""
        assert (self.free >= 0).all() and (self.free <= self.cap).all()
        assert not (self.occ_gpus_on(HELD) > 0), "a server held by inference runs training workers"
        assert not (self.occ_gpus_on(DOWN) > 0), "a server out of service runs training workers"
        for k in _GROUPS:
            assert self.free_in[k] == int(self.free[self.group == k].sum()), "free-GPU counter out of step"
            assert self.flex_in[k] == int(self.flex[self.group == k].sum()), "flexible-GPU counter out of step"
            assert self.servers_in[k] == int((self.group == k).sum()), "server counter out of step"

    def occ_gpus_on(self, group: int) -> int:
        """GPUs in use on servers of ``group``."""
        m = self.group == group
        return int((self.cap[m] - self.free[m]).sum())
