"""The cluster network as the simulator sees it: which links each running multi-node job loads, and how fast
each job runs given the traffic it shares them with.

Links are each node's NICs (one link per node, at the node's line rate) and each rack's uplink to the spine
(the rack's line rate over the oversubscription ratio). A job spanning several nodes loads the NIC link of
every node it uses with its intensity, and, when it spans racks, the uplinks of those racks too. A job's
contention ratio is ``1 / (1 + s * max_l x_l)`` over its links (see :mod:`gpufleet.perf.contention`): it
is held back by its most loaded link, where it shares the link max-min fairly with the jobs communicating
there. On a NIC, ``x`` is the other jobs' load (the calibrated case: DeepShare co-located jobs on the same
nodes); on a rack uplink, which carries many nodes' traffic, only the load beyond its capacity slows
anyone: ``x = max(0, load - capacity) / capacity``. Single-node jobs load no link and see no contention.

Attaching or detaching a job changes the loads of its links only, so only the jobs on those links need
a new speed: :meth:`NetworkState.attach` and :meth:`NetworkState.detach` return exactly those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.perf.contention import ContentionModel
from gpufleet.sim.partition import Allocation, Partition


@dataclass(frozen=True)
class JobComm:
    """Per-job communication profile: a DeepShare profile name (None: no network traffic) and a volume scale."""

    profile: list[str | None]
    scale: np.ndarray

    @classmethod
    def from_frame(cls, jobs: Any) -> JobComm:
        """Read ``comm_profile`` / ``comm_scale`` columns, or a ``model`` column naming DeepShare's workloads."""
        n = jobs.height
        cols = set(jobs.columns)
        if "comm_profile" in cols:
            prof = jobs["comm_profile"].to_list()
            scale = jobs["comm_scale"].fill_null(1.0).cast(float).to_numpy() if "comm_scale" in cols else np.ones(n)
        elif "model" in cols:
            prof = jobs["model"].to_list()
            scale = np.ones(n)
        else:
            raise ConfigError(
                "--network needs each job's communication profile: a 'model' column (DeepShare "
                "workload or a model name, see `--columns model=...`) or 'comm_profile'"
            )
        return cls(list(prof), np.asarray(scale, dtype=np.float64))


class NetworkState:
    """Link loads of the running multi-node jobs and each job's current contention ratio."""

    def __init__(
        self,
        parts: Sequence[Partition],
        pools: Sequence[Any],
        oversubscription: float,
        comm: JobComm,
        gpus: Sequence[int],
        model: ContentionModel | None = None,
        placement_penalty: float = 0.2,
    ) -> None:
        self.model = model or ContentionModel.default()
        self.comm = comm
        self.gpus = list(gpus)
        self.penalty = placement_penalty
        known = set(self.model.models)
        bad = sorted({p for p in comm.profile if p is not None and p not in known})
        if bad:
            raise ConfigError(
                f"unknown communication profile(s) {', '.join(bad[:5])}; known: {', '.join(known)} "
                "(map model names with gpufleet.perf.comm_profiles.assign_profiles)"
            )
        # link numbering: per partition, its nodes' NIC links, then its racks' uplinks
        self._nic_base: list[int] = []
        self._rack_base: list[int] = []
        self._per_rack: list[int] = []
        self._gbps: list[float] = []
        self._gpn: list[int] = []
        cap: list[float] = []
        uplink: list[bool] = []
        for part, pool in zip(parts, pools, strict=True):
            self._nic_base.append(len(cap))
            cap.extend([1.0] * part.nodes)
            uplink.extend([False] * part.nodes)
            self._rack_base.append(len(cap))
            per_rack = int(pool.nodes_per_rack)
            racks = -(-part.nodes // per_rack)
            cap.extend([per_rack / float(oversubscription)] * racks)
            uplink.extend([True] * racks)
            self._per_rack.append(per_rack)
            self._gbps.append(float(pool.nics_per_node * pool.nic_spec.gbps))
            self._gpn.append(part.gpus_per_node)
        self.cap = cap
        self.uplink = uplink
        self.load = [0.0] * len(cap)
        self.on_link: list[dict[int, float]] = [{} for _ in cap]
        self.links: dict[int, list[int]] = {}
        self.s: dict[int, float] = {}
        self.base_speed: dict[int, float] = {}
        self.committed: dict[int, float] = {}  # the contention ratio in force for each running job
        self.worst: dict[int, float] = {}  # each running job's bottleneck term when it was last rated
        self._stale: set[int] = set()  # running jobs whose bottleneck may have moved since they were last rated
        self._cache: dict[tuple[str, int, int, int], tuple[float, float, float]] = {}
        self.multi_node_starts = 0
        self.starts = 0

    # ------------------------------------------------------------------ per-job constants
    def _profile(self, j: int, p: int, nodes: int) -> tuple[float, float, float]:
        """(sensitivity, intensity, isolated placement speed) of job ``j`` on ``nodes`` nodes of partition ``p``."""
        prof = self.comm.profile[j]
        g = self.gpus[j]
        gpn = self._gpn[p]
        if prof is None:
            speed = 1.0 if nodes <= -(-g // gpn) else 1.0 - self.penalty
            return 0.0, 0.0, speed
        key = (prof, g, nodes, p)
        got = self._cache.get(key)
        if got is None:
            m = self.model
            gbps = self._gbps[p]
            rel = m.relative_speed(prof, g, nodes, gpn)
            # the spread's extra time is network time measured at 40 Gb/s: it shrinks on a faster NIC
            beta = m.reference_gbps / gbps
            got = (
                m.sensitivity(prof, g, nodes, gbps),
                m.intensity(prof, g, nodes, gbps),
                1.0 / (1.0 + (1.0 / rel - 1.0) * beta) if rel > 0 else 0.0,
            )
            self._cache[key] = got
        sc = float(self.comm.scale[j])
        return got[0] * sc, got[1] * sc, got[2]

    def _links_of(self, p: int, alloc: Allocation) -> list[int]:
        if len(alloc) <= 1:
            return []
        nic = self._nic_base[p]
        out = [nic + node for node, _ in alloc]
        per = self._per_rack[p]
        racks = sorted({node // per for node, _ in alloc})
        if len(racks) > 1:
            out.extend(self._rack_base[p] + r for r in racks)
        return out

    # ------------------------------------------------------------------ mutations
    def attach(self, j: int, p: int, alloc: Allocation) -> list[int]:
        """Job ``j`` starts on ``alloc``; returns the other running jobs whose links it now shares."""
        s, inten, speed = self._profile(j, p, len(alloc))
        self.s[j] = s
        self.base_speed[j] = speed
        self.starts += 1
        links = self._links_of(p, alloc) if inten > 0.0 or s > 0.0 else []
        self.links[j] = links
        if len(alloc) > 1:
            self.multi_node_starts += 1
        touched: dict[int, None] = {}
        worst = self.worst
        for link in links:
            jobs = self.on_link[link]
            after = self.load[link] + inten
            jobs[j] = inten
            self.load[link] = after
            cap = self.cap[link]
            if self.uplink[link]:
                x = (after - cap) / cap
                if x <= 0.0:
                    continue  # under capacity: nobody on this uplink changes speed
                for k in jobs:
                    if k != j and x > worst.get(k, 0.0) + 1e-12:
                        touched[k] = None
            else:
                for k, pk in jobs.items():
                    # k slows only if this link becomes its most loaded one
                    if k != j and (after - pk) / cap > worst.get(k, 0.0) + 1e-12:
                        touched[k] = None
        self._stale.update(touched)
        return list(touched)

    def detach(self, j: int) -> list[int]:
        """Job ``j`` stops; returns the running jobs that shared a link with it."""
        touched: dict[int, None] = {}
        for link in self.links.pop(j, ()):
            jobs = self.on_link[link]
            inten = jobs.pop(j)
            before = self.load[link]
            self.load[link] = before - inten if jobs else 0.0  # no float residue on an idle link
            cap = self.cap[link]
            worst = self.worst
            if self.uplink[link]:
                x = (before - cap) / cap
                if x <= 0.0:
                    continue
                for k in jobs:
                    if x >= worst.get(k, 0.0) - 1e-12:
                        touched[k] = None
            else:
                for k, pk in jobs.items():
                    # k speeds up only if this link was its most loaded one
                    x = (before - pk) / cap
                    if x > 0.0 and x >= worst.get(k, 0.0) - 1e-12:
                        touched[k] = None
        self._stale.update(touched)
        self._stale.discard(j)
        self.s.pop(j, None)
        self.worst.pop(j, None)
        self.base_speed.pop(j, None)
        self.committed.pop(j, None)
        return list(touched)

    # ------------------------------------------------------------------ speeds
    def _term(self, j: int) -> float:
        worst = 0.0
        load, cap, on, up = self.load, self.cap, self.on_link, self.uplink
        for link in self.links.get(j, ()):
            x = (load[link] - cap[link] if up[link] else load[link] - on[link][j]) / cap[link]
            if x > worst:
                worst = x
        return worst

    def ratio(self, j: int) -> float:
        """Running job ``j``'s throughput over what it would get with its links to itself."""
        s = self.s.get(j, 0.0)
        if s == 0.0:
            return 1.0
        term = self._term(j)
        self.worst[j] = term
        self._stale.discard(j)
        return 1.0 / (1.0 + s * term)

    def current_ratio(self, j: int) -> float:
        """The ratio in force for running job ``j`` (no side effect: for observers such as rewards)."""
        return self.committed.get(j, 1.0)

    def rate(self, j: int) -> float:
        """Put running job ``j``'s current contention ratio in force; returns its speed relative to running
        alone on the fewest nodes (placement x contention)."""
        r = self.ratio(j)
        self.committed[j] = r
        return self.base_speed[j] * r

    def lost(self, j: int) -> float:
        """Throughput share job ``j`` has been losing to contention since it was last rated."""
        return 1.0 - self.committed.get(j, 1.0)

    # ------------------------------------------------------------------ what-if, for policies
    def predict(self, j: int, p: int, alloc: Allocation) -> tuple[float, float, float]:
        """If ``j`` started on ``alloc`` now: (its speed, its contention ratio, GPU-weighted speed it takes
        from the running jobs that would share its links). Nothing changes."""
        s, inten, speed = self._profile(j, p, len(alloc))
        links = self._links_of(p, alloc) if inten > 0.0 or s > 0.0 else []
        if not links:
            return speed, 1.0, 0.0
        load, cap, on, up = self.load, self.cap, self.on_link, self.uplink
        term = max(max(0.0, (load[link] + inten - cap[link]) if up[link] else load[link]) / cap[link] for link in links)
        own = 1.0 / (1.0 + s * term)
        # the jobs met on my links, each with the worst term my traffic would give it on a shared link; a job
        # loses speed only where that beats its current bottleneck (its term when last rated, unless a start or
        # stop has touched it since)
        after_of: dict[int, float] = {}
        for link in links:
            c = cap[link]
            if up[link]:
                if load[link] + inten <= c:
                    continue  # an uplink still under capacity slows nobody: only jobs met on other links can lose
                a = max(0.0, load[link] + inten - c) / c
                for k in on[link]:
                    if a > after_of.get(k, -1.0):
                        after_of[k] = a
            else:
                lk = load[link]
                for k, pk in on[link].items():
                    a = (lk - pk) / c + inten / c
                    if a > after_of.get(k, -1.0):
                        after_of[k] = a
        harm = 0.0
        worst, stale, s_of = self.worst, self._stale, self.s
        for k, after in after_of.items():
            sk = s_of.get(k, 0.0)
            if sk == 0.0:
                continue
            before = worst[k] if k in worst and k not in stale else self._term(k)
            if after > before:
                harm += self.gpus[k] * self.base_speed[k] * (1.0 / (1.0 + sk * before) - 1.0 / (1.0 + sk * after))
        return speed * own, own, harm

    def nic_gbps(self, p: int) -> float:
        """Line rate of one node of partition ``p``, Gbit/s (all its NICs)."""
        return self._gbps[p]

    def nic_load(self, p: int, node: int) -> float:
        """Traffic intensity on the NIC link of ``node`` of partition ``p``."""
        return self.load[self._nic_base[p] + node]

    def summary(self, contention_gpu_s: float) -> dict[str, Any]:
        """Network figures for a run's summary."""
        return {
            "contention_gpu_h": contention_gpu_s / 3600.0,
            "multi_node_share": self.multi_node_starts / self.starts if self.starts else 0.0,
        }


def network_for_run(cluster: Any, parts: Sequence[Partition], jobs: Any, config: Any) -> NetworkState | None:
    """The network of a run whose :class:`~gpufleet.sim.config.SimConfig` asks for one, else None."""
    if not config.network:
        return None
    return network_for(cluster, parts, jobs, placement_penalty=config.placement_penalty)


def network_for(
    cluster: Any,
    parts: Sequence[Partition],
    jobs: Any,
    model: ContentionModel | None = None,
    placement_penalty: float = 0.2,
) -> NetworkState:
    """A :class:`NetworkState` for the training pools of ``cluster`` and the jobs of frame ``jobs``."""
    pools = {pool.name: pool for pool in cluster.pools}
    sorted_jobs = jobs.sort("submit_s", maintain_order=True)
    return NetworkState(
        parts,
        [pools[p.name] for p in parts],
        cluster.network.oversubscription,
        JobComm.from_frame(sorted_jobs),
        sorted_jobs["num_gpus"].cast(int).to_list(),
        model,
        placement_penalty,
    )
