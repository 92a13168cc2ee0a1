"""Aryl's jobs on the event core: two pools, inference servers loaned to training, jobs that grow and shrink.

:class:`ElasticSimulator` is the core of ``gpufleet.sim.engine`` (one event loop, one job state, one
checkpoint rollback and one set of result frames) with a server-level placement: a job runs *workers* of
``g`` GPUs, each on one server; its base demand (``min_workers``) is placed when it starts, best fit,
training servers first, scaling in other jobs' flexible workers when it needs their GPUs; a fixed-size
job is an elastic job with min = max workers. What Aryl adds are features of the core:
``features.loaning`` (loaning and reclaiming inference servers as the inference load moves) and
``features.knapsack`` (rounds every ``interval_s`` that give the GPUs left over to elastic jobs' extra
workers). A job's progress rate is ``T(effective workers) / T(base workers)`` from the scaling curve, where
a worker on a loaned server counts ``loan_speed`` of a training-server worker; every change of a running
job's workers pauses it for ``scale_pause_s``.
"""

from __future__ import annotations

import heapq
from array import array
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from gpufleet.sched.aryl import ArylPolicy
from gpufleet.sim.config import SimConfig
from gpufleet.sim.elastic_jobs import ElasticConfig, assign_elastic, loan_speed_from_catalog
from gpufleet.sim.engine import _COMPLETE, Simulator
from gpufleet.sim.features.base import Feature
from gpufleet.sim.features.inference import PoolGPUs, held_schedule, usage_over_window
from gpufleet.sim.frames import job_frame, timeline_frame
from gpufleet.sim.jobstate import RUNNING, UNSCHEDULABLE, WAITING, checkpoint_kept
from gpufleet.sim.metrics import summarize, time_weighted_mean
from gpufleet.sim.network import network_for_run
from gpufleet.sim.result import SimResult
from gpufleet.sim.scaling import PowerLawCurve, ScalingCurve
from gpufleet.sim.servers import DOWN, HELD, LOANED, TRAINING, Servers
from gpufleet.sim.workload import Workload, partitions_for

if TYPE_CHECKING:
    from gpufleet.sim.failures import OutagePlan

__all__ = ["ElasticSimulator", "held_schedule"]


class ElasticSimulator(Simulator):
    """One run of one Aryl-family policy over one trace on a two-pool cluster; call :meth:`run` once."""

    def __init__(
        self,
        jobs: pl.DataFrame,
        cluster: Any,
        policy: ArylPolicy,
        config: SimConfig | None = None,
        elastic: ElasticConfig | None = None,
        inference: Any = None,
        curve: ScalingCurve | None = None,
        outages: OutagePlan | None = None,
        features: list[Feature] | None = None,
    ) -> None:
        self.ecfg = elastic or ElasticConfig()
        jobs = jobs.sort("submit_s", maintain_order=True)
        workload = Workload.from_frame(jobs)
        parts = partitions_for(cluster)  # raises when the cluster has no training pool
        training = cluster.training_pools
        inf_pools = cluster.inference_pools
        ls = self.ecfg.loan_speed
        if ls is None:
            ls = loan_speed_from_catalog(training[0].gpu, inf_pools[0].gpu) if inf_pools else 1.0
        self.loan_speed = ls
        self.srv = Servers(cluster, ls)
        self.cluster_gpus = PoolGPUs.of(cluster)
        self.inference = inference if inf_pools else None
        self.loans = policy.loan and self.inference is not None
        ej = assign_elastic(
            jobs, self.ecfg, max(p.gpus_per_node for p in training), elastic_override=None if policy.elastic else False
        )
        self.g: list[int] = ej.gpus_per_worker.tolist()
        self.wmin: list[int] = ej.min_workers.tolist()
        self.wmax: list[int] = ej.max_workers.tolist()
        self.workload = workload
        self.curve = curve or PowerLawCurve()
        self.curve_of = self._job_curves(jobs, training[0])
        self.base_rate_t = [c.throughput(m) for c, m in zip(self.curve_of, self.wmin, strict=True)]
        n = len(workload)
        self.scale_events = [0] * n
        self.nbase = [0] * n
        self.nflex = [0] * n
        self.where: list[dict[int, None]] = [{} for _ in range(n)]
        self.running: dict[int, None] = {}
        self.busy_loaned = 0  # GPUs training holds on loaned servers
        self.eff = [0.0] * n  # effective workers (loaned-server workers count loan_speed)
        self.eff_flex = [0.0] * n
        self.counters = {"reclaims": 0, "reclaim_preemptions": 0, "scale_events": 0}
        self.inf_needed = len(self.srv.inference_ids)
        self._masks: dict[tuple[str | None, bool], np.ndarray] = {}
        self._type_of: list[str | None] = [t.lower() if isinstance(t, str) else None for t in workload.gpu_type]
        self._tl = {
            k: array("d")
            for k in ("t", "busy", "loaned_used", "loaned", "loaned_gpus", "inference", "needed", "queued", "running")
        }
        # the first server of each training pool, in the order of partitions_for
        starts = np.cumsum([0] + [p.nodes for p in cluster.pools]).tolist()
        self._part_server = [
            first for first, pool in zip(starts[:-1], cluster.pools, strict=True) if pool.kind == "training"
        ]
        # Aryl's features: loaning and reclaiming follow the inference load, knapsack rounds scale elastic jobs
        feats: list[Feature] = []
        if self.inference is not None:
            from gpufleet.sim.features.loaning import InferenceLoans

            feats.append(InferenceLoans(self.inference, self.ecfg.reclaim_notice_s))
        if policy.elastic:
            from gpufleet.sim.features.knapsack import KnapsackRounds

            feats.append(KnapsackRounds(self.ecfg.interval_s))
        feats.extend(features or ())
        # network contention on the training fabric: each server's (training pool, node), -1 off the fabric
        self._srv_part = [-1] * len(self.srv)
        self._srv_node = [-1] * len(self.srv)
        for p, first in enumerate(self._part_server):
            for node in range(parts[p].nodes):
                self._srv_part[first + node] = p
                self._srv_node[first + node] = node
        network = network_for_run(cluster, parts, jobs, config or SimConfig())
        super().__init__(workload, parts, policy, config, outages, network, feats)
        self.rate = self.seg_speed  # the progress rate of each job's current segment
        self._skip_futile = False  # loaning, reclaims and knapsack rounds change a pass's outcome without churn
        # a GPU-level placement (contention, spread, rl, random) chooses the node set of a job's base demand on
        # the training pool; ``parts`` then mirrors the training servers' free GPUs for it to read
        placer = policy.placer
        self._gpu_placer: Any = placer if placer.gpu_level else None
        self._part_type = [part.gpu_type.lower() for part in parts]
        self._netf: Any = next((f for f in self.features if f.name == "network"), None)

    # ------------------------------------------------------------------ setup
    def _job_curves(self, jobs: pl.DataFrame, pool: Any) -> list[ScalingCurve]:
        """Per job: the ``perf`` model's curve when its ``model`` column names a catalog model, else the default
        (also for DeepShare's workload names, which the network model reads from the same column)."""
        n = len(self.workload)
        if "model" not in jobs.columns:
            return [self.curve] * n
        from gpufleet.errors import ConfigError, GpufleetError
        from gpufleet.perf.comm_profiles import DEEPSHARE_MODELS
        from gpufleet.sim.scaling import PerfCurve

        cache: dict[tuple[str, int], ScalingCurve] = {}
        out: list[ScalingCurve] = []
        for j, name in enumerate(jobs["model"].cast(pl.Utf8).to_list()):
            if not name or name in DEEPSHARE_MODELS:
                out.append(self.curve)
                continue
            key = (name, self.g[j])
            if key not in cache:
                try:
                    cache[key] = PerfCurve(name, pool.gpu, self.g[j], nic=pool.nic)
                except GpufleetError as exc:
                    raise ConfigError(f"job {self.workload.job_id[j]} names model '{name}': {exc}") from None
            out.append(cache[key])
        return out

    def _resolve_allowed(self) -> list[tuple[int, ...]]:
        """Jobs whose base demand fits no training pool are reported and never queued (the core's hook)."""
        self.gpus = [g * m for g, m in zip(self.g, self.wmin, strict=True)]
        self.unschedulable: dict[str, int] = {}
        srv = self.srv
        for j in range(self.n):
            mask = self._mask(j, loaned=False)
            if not mask.any():
                reason = f"no training pool of GPU type '{self._type_of[j]}'"
            elif int((srv.cap[mask] // self.g[j]).sum()) < self.wmin[j]:
                reason = "base demand exceeds every training pool"
            else:
                continue
            self.state[j] = UNSCHEDULABLE
            self.unschedulable[reason] = self.unschedulable.get(reason, 0) + 1
        return [()] * self.n

    def _mask(self, j: int, loaned: bool) -> np.ndarray:
        """Servers job ``j`` may use: training servers of its GPU type (and loaned servers of any type)."""
        t = self._type_of[j]
        key = (t, loaned and self.loans)
        m = self._masks.get(key)
        if m is None:
            m = self.srv.group == TRAINING
            if t is not None:
                m &= self.srv.gpu_type == t
            if key[1]:
                m = m | (self.srv.group == LOANED)
            self._masks[key] = m
        return m

    # ------------------------------------------------------------------ workers on servers
    def _put(self, s: int, j: int, flexible: bool) -> None:
        """One more worker of job ``j`` on server ``s``, with every counter that depends on it."""
        g = self.g[j]
        self.srv.add(s, j, g, flexible)
        self.where[j][s] = None
        sp = float(self.srv.speed[s])
        self.eff[j] += sp
        if flexible:
            self.nflex[j] += 1
            self.eff_flex[j] += sp
        else:
            self.nbase[j] += 1
        self.busy += g
        if self.srv.group[s] == LOANED:
            self.busy_loaned += g
        if self._gpu_placer is not None:
            self._mirror(s)

    def _take(self, s: int, j: int, flexible: bool) -> None:
        """One worker fewer of job ``j`` on server ``s``."""
        g = self.g[j]
        self.srv.remove(s, j, g, flexible)
        if j not in self.srv.occ[s]:
            del self.where[j][s]
        sp = float(self.srv.speed[s])
        self.eff[j] -= sp
        if flexible:
            self.nflex[j] -= 1
            self.eff_flex[j] -= sp
        else:
            self.nbase[j] -= 1
        self.busy -= g
        if self.srv.group[s] == LOANED:
            self.busy_loaned -= g
        if self._gpu_placer is not None:
            self._mirror(s)

    def _mirror(self, s: int) -> None:
        """Bring the training partition's node of server ``s`` in line with the server's free GPUs (a server
        out of training service shows none), for a GPU-level placement to read."""
        p = self._srv_part[s]
        if p < 0:
            return
        part, node = self.parts[p], self._srv_node[s]
        want = int(self.srv.free[s]) if self.srv.group[s] == TRAINING else 0
        have = part.free[node]
        if want < have:
            part._take(node, have - want)
            part.total_free -= have - want
        elif want > have:
            part.release([(node, want - have)])

    def _take_all_on(self, s: int, j: int) -> None:
        b, f = self.srv.occ[s][j]
        for _ in range(b):
            self._take(s, j, False)
        for _ in range(f):
            self._take(s, j, True)

    # ------------------------------------------------------------------ segments
    def _close_segment(self, j: int, now: float, account: bool = True) -> None:
        """Bank running ``j``'s progress up to ``now`` before its workers (or its contention) change."""
        if account and self._netf is not None:
            self._netf.contention_gpu_s += self._netf.state.lost(j) * (now - self.pseg_start[j]) * self.gpus[j]
        base = self.progress_now(j, now)
        over = self.seg_over[j] - (now - self.pseg_start[j])
        self.seg_over[j] = over if over > 0.0 else 0.0
        self.pseg_start[j] = now
        self.pseg_base[j] = base

    def _new_segment(self, j: int, now: float, pause: float, attach: bool = True) -> None:
        """Go on with the job's current workers (after ``pause`` s at least); schedule its completion.

        With the network on, ``attach`` puts the job's links (its training servers' NICs and racks) in the
        network model first; its speed is the scaling curve's times its contention ratio."""
        self.seg_over[j] = max(self.seg_over[j], pause)
        rate = self.curve_of[j].throughput(self.eff[j]) / self.base_rate_t[j]
        net = self.network
        if net is not None:
            if attach:
                self._attach(j)
            rate *= net.committed.get(j, 1.0)
        self.seg_speed[j] = rate
        fin = now + self.seg_over[j] + (self.remaining[j] - self.pseg_base[j]) / rate
        self.expected_finish[j] = fin
        self._event_at[j] = fin
        self._ver[j] += 1
        self._seq += 1
        heapq.heappush(self._events, (fin, _COMPLETE, self._seq, j, self._ver[j]))

    def _attach(self, j: int) -> None:
        """(Re)attach running ``j`` to the network on its training servers (those of the pool holding most)."""
        net = self.network
        assert net is not None and self._netf is not None
        touched = net.detach(j) if j in net.links else []
        by_part: dict[int, list[tuple[int, int]]] = {}
        for s in self.where[j]:
            p = self._srv_part[s]
            if p >= 0:
                b, f = self.srv.occ[s][j]
                by_part.setdefault(p, []).append((self._srv_node[s], (b + f) * self.g[j]))
        if by_part:
            p = max(by_part, key=lambda q: (len(by_part[q]), -q))
            touched += net.attach(j, p, sorted(by_part[p]))
            net.rate(j)  # puts its contention ratio in force
        self._netf._dirty.update(dict.fromkeys(touched))

    def change_speed(self, k: int, now: float, new: float) -> None:
        """Running ``k``'s contention changed (the network feature has put its new ratio in force)."""
        self._close_segment(k, now, account=False)
        self._new_segment(k, now, 0.0, attach=False)

    def _rescaled(self, j: int, now: float) -> None:
        """Job ``j``'s workers changed while it ran: account the old segment, pause, continue."""
        self.scale_events[j] += 1
        self.counters["scale_events"] += 1
        self._new_segment(j, now, self.ecfg.scale_pause_s)

    # ------------------------------------------------------------------ transitions (the core's hooks)
    def _arrive(self, j: int) -> None:
        self._class_of[j] = (self.wmin[j], self.g[j], self._type_of[j] or "")  # type: ignore[assignment]
        self.state[j] = WAITING
        self.n_waiting += 1
        self.waiting_gpus += self.gpus[j]
        self._push_waiting(j)

    def worker_gpus(self, j: int) -> int:
        """A worker of job ``j`` holds ``g`` GPUs on one server: a node's share is a whole number of workers."""
        return self.g[j]

    def running_jobs(self) -> list[int]:
        """Every running job."""
        return list(self.running)

    def _begin(self, j: int, now: float) -> None:
        """Job ``j``'s base demand is placed: it runs from ``now``."""
        self._wver[j] += 1
        self._dirty.add(self._class_of[j])
        self.state[j] = RUNNING
        self.n_waiting -= 1
        self.waiting_gpus -= self.gpus[j]
        self.running[j] = None
        self.n_running += 1
        if self.first_start[j] != self.first_start[j]:
            self.first_start[j] = now
        pause = self.config.restart_s if self.restarts[j] else 0.0
        if self._penalty:
            pause += self._penalty.pop(j, 0.0)
        self.seg_start[j] = now
        self.pseg_start[j] = now
        self.pseg_base[j] = 0.0
        self.seg_over[j] = 0.0
        self.token[j] += 1
        self._new_segment(j, now, pause)
        self.policy.on_start(j, now)

    def _release_placement(self, j: int) -> None:
        self._release_all(j)
        del self.running[j]

    def _release_all(self, j: int) -> None:
        for s in list(self.where[j]):
            self._take_all_on(s, j)
        self.eff[j] = self.eff_flex[j] = 0.0  # drop float residue

    def _evict_flex(self, s: int, need: int, now: float, touched: set[int]) -> None:
        """Scale in flexible workers on server ``s`` until it has ``need`` free GPUs."""
        srv = self.srv
        for v in sorted(srv.occ[s], key=lambda x: (-srv.occ[s][x][1], x)):
            while srv.occ[s].get(v, (0, 0))[1] > 0 and srv.free[s] < need:
                if v not in touched:
                    self._close_segment(v, now)
                    touched.add(v)
                self._take(s, v, True)
            if srv.free[s] >= need:
                return

    def _admit(self, j: int, now: float) -> bool:
        """Place job ``j``'s base demand (training servers first, scaling in flexible workers if needed)."""
        srv = self.srv
        g, w = self.g[j], self.wmin[j]
        room = srv.free_in[TRAINING] + srv.flex_in[TRAINING]
        if self.loans:
            room += srv.free_in[LOANED] + srv.flex_in[LOANED]
        if room < g * w:  # cheap necessary condition first: most attempts in a busy cluster fail here
            return False
        if self._gpu_placer is not None:
            placed = self._admit_placed(j, now)
            if placed is not None:
                return placed
        train = self._mask(j, loaned=False)
        allm = self._mask(j, loaned=True)
        if srv.slots(g, allm, with_flex=False) < w and srv.slots(g, allm, with_flex=True) < w:
            return False
        loaned = allm & ~train
        touched: set[int] = set()
        for _ in range(w):
            s = srv.best_fit(g, train, False)
            if s < 0:
                s = srv.best_fit(g, train, True)
                if s >= 0:
                    self._evict_flex(s, g, now, touched)
            if s < 0 and self.loans:
                s = srv.best_fit(g, loaned, False)
                if s < 0:
                    s = srv.best_fit(g, loaned, True)
                    if s >= 0:
                        self._evict_flex(s, g, now, touched)
            assert s >= 0, "slot count said the base demand fits"
            self._put(s, j, False)
        for v in touched:
            self._rescaled(v, now)
        self._begin(j, now)
        return True

    def _admit_placed(self, j: int, now: float) -> bool | None:
        """Place job ``j``'s base demand on the free GPUs of a training pool where the GPU-level placement
        chooses; None when it finds no node set there (Aryl's best fit then tries flexible workers' GPUs and
        loaned servers), False when it chose to wait.

        A worker needs ``g`` GPUs on one server, so a node set whose count on some node is not a whole number
        of workers is not taken (best fit places the job instead)."""
        g, w = self.g[j], self.wmin[j]
        t = self._type_of[j]
        placer = self._gpu_placer
        for p, part in enumerate(self.parts):
            if (t is not None and self._part_type[p] != t) or part.total_free < g * w:
                continue
            placer.may_wait = True
            alloc = placer.place(j, p, part)
            if alloc is None:
                if placer.waited:
                    return False
                continue
            part.release(alloc)  # the workers below take the GPUs server by server (and mirror them back)
            if any(c % g for _, c in alloc):
                continue
            for node, c in alloc:
                s = self._server(p, node)
                for _ in range(c // g):
                    self._put(s, j, False)
            self._begin(j, now)
            return True
        return None

    def _schedule(self) -> None:
        """Admit waiting jobs' base demands, best first; a class whose best job does not fit is skipped (its
        other jobs are the same size and worse)."""
        if not self.n_waiting:
            return
        now = self.now
        heads = []
        for ck in self._class_keys:
            e = self._head(ck)
            if e is not None:
                heads.append((e, ck))
        heads.sort()
        while heads:
            entry, ck = heads.pop(0)
            if self._admit(entry[2], now):
                e = self._head(ck)
                if e is not None:
                    heads.append((e, ck))
                    heads.sort()

    # ------------------------------------------------------------------ servers changing hands
    def _move(self, servers: np.ndarray, group: int) -> None:
        """Hand empty ``servers`` to ``group`` (LOANED, HELD, DOWN, TRAINING); cached placement masks go stale."""
        self.srv.move(servers, group)
        self._masks.clear()
        if self._gpu_placer is not None:
            for s in servers.tolist():
                self._mirror(s)

    def _checkpointed(self, j: int, done: float) -> float:
        """Progress job ``j`` keeps of ``done`` when stopped now: its last checkpoint, never behind its resume."""
        return checkpoint_kept(self.duration[j] - self.remaining[j], done, self.config.checkpoint_interval_s)

    def _server(self, p: int, node: int) -> int:
        return int(self._part_server[p]) + node

    def jobs_on_node(self, p: int, node: int) -> list[int]:
        """The running jobs with a worker on node ``node`` of training pool ``p``."""
        return list(self.srv.occ[self._server(p, node)])

    def node_down(self, p: int, node: int) -> None:
        """Node ``node`` of training pool ``p`` (emptied by the caller) goes out of service."""
        self._move(np.array([self._server(p, node)]), DOWN)

    def node_up(self, p: int, node: int) -> None:
        """Node ``node`` of training pool ``p`` is back in service."""
        self._move(np.array([self._server(p, node)]), TRAINING)

    # ------------------------------------------------------------------ timeline
    def _record(self, t: float) -> None:
        tl = self._tl
        if tl["t"] and tl["t"][-1] == t:
            for k in tl:
                tl[k].pop()
        tl["t"].append(t)
        tl["busy"].append(self.busy)
        tl["loaned_used"].append(self.busy_loaned)
        tl["loaned"].append(self.srv.servers_in[LOANED])
        tl["loaned_gpus"].append(self.srv.free_in[LOANED] + self.busy_loaned)  # all GPUs of the loaned servers
        tl["inference"].append(self.srv.free_in[HELD])  # held servers run no training: all their GPUs are free
        tl["needed"].append(self.inf_needed)
        tl["queued"].append(self.n_waiting)
        tl["running"].append(len(self.running))

    # ------------------------------------------------------------------ invariants (debug mode)
    def check_invariants(self) -> None:
        """Raise AssertionError if the cluster state is impossible."""
        srv = self.srv
        srv.check()
        used = 0
        for j in self.running:
            assert self.state[j] == RUNNING
            assert self.nbase[j] == self.wmin[j], f"job {j} runs below or above its base demand"
            assert self.nflex[j] <= self.wmax[j] - self.wmin[j]
            assert all(j in srv.occ[s] for s in self.where[j]), f"job {j}: server bookkeeping out of step"
            tot = sum(sum(srv.occ[s][j]) for s in self.where[j])
            assert tot == self.nbase[j] + self.nflex[j]
            used += tot * self.g[j]
        assert used == self.busy == int((srv.cap - srv.free).sum())
        loaned = srv.group == LOANED
        assert self.busy_loaned == int((srv.cap[loaned] - srv.free[loaned]).sum())
        for j in self.running:
            assert abs(self.eff[j] - sum(sum(srv.occ[s][j]) * srv.speed[s] for s in self.where[j])) < 1e-6
            assert abs(self.eff_flex[j] - sum(srv.occ[s][j][1] * srv.speed[s] for s in self.where[j])) < 1e-6
        flex = np.zeros_like(srv.flex)
        for s, occ in enumerate(srv.occ):
            flex[s] = sum(f * self.g[j] for j, (_, f) in occ.items())
        assert (flex == srv.flex).all()

    # ------------------------------------------------------------------ results
    def _result(self, wall: float, interrupted: bool) -> SimResult:
        w = self.workload
        now = self._tl["t"][-1] if self._tl["t"] else 0.0
        held = np.array(self.held_s)
        for j in self.running:  # unfinished runs count the time held so far
            held[j] += now - self.seg_start[j]
        extra: dict[str, Any] = {"scale_events": self.scale_events, "max_workers": self.wmax, "min_workers": self.wmin}
        for f in self.features:
            extra.update(f.job_columns())
        jobs = job_frame(w, self.first_start, self.finish, held, self.preemptions, extra)
        tl = {k: np.frombuffer(v, dtype=np.float64) for k, v in self._tl.items()}
        timeline = timeline_frame(
            tl["t"],
            {
                "busy_gpus": tl["busy"],
                "queued_jobs": tl["queued"],
                "running_jobs": tl["running"],
                "loaned_servers": tl["loaned"],
                "loaned_gpus_used": tl["loaned_used"],
                "loaned_gpus": tl["loaned_gpus"],
                "inference_gpus": tl["inference"],
                "inference_servers_needed": tl["needed"],
            },
        )
        meta: dict[str, Any] = {
            "events": self.events_processed,
            "interrupted": interrupted,
            "unschedulable": dict(self.unschedulable),
            "lost_work_gpu_s": float(sum(lo * g for lo, g in zip(self.lost, self.gpus, strict=True))),
            "config": self.config,
            "elastic": self.ecfg,
            "loan_speed": self.loan_speed,
        }
        total = self.srv.training_gpus
        # gpu_util: busy GPUs on the training pool over its size (work on loaned servers shows in usage)
        on_training = timeline.with_columns(pl.col("busy_gpus") - pl.col("loaned_gpus_used"))
        summary = summarize(self.policy.name, jobs, on_training, total, wall, meta)
        summary.update(self._aryl_metrics(timeline))
        for f in self.features:
            summary.update(f.summary(jobs, timeline))
        return SimResult(self.policy.name, summary, jobs, timeline, total, meta)

    def _aryl_metrics(self, timeline: pl.DataFrame) -> dict[str, Any]:
        t = timeline["time_s"].to_numpy()
        if not len(t):  # nothing ran: an empty trace, or no job fits any training pool
            return {
                "usage": float("nan"),
                "loaned_gpu_hours": 0.0,
                "reclaims": 0,
                "reclaim_preemptions": 0,
                "scale_events": 0,
                "elastic_jobs": 0,
            }
        start, end = self.submit[0], self.submit[-1]
        loaned_used = time_weighted_mean(t, timeline["loaned_gpus_used"].to_numpy(), t[0], t[-1]) * (t[-1] - t[0])
        out = {
            "usage": usage_over_window(
                t, timeline["busy_gpus"].to_numpy(), self.inference, self.cluster_gpus, start, end
            ),
            "loaned_gpu_hours": float(loaned_used / 3600.0),
            "reclaims": self.counters["reclaims"],
            "reclaim_preemptions": self.counters["reclaim_preemptions"],
            "scale_events": self.counters["scale_events"],
            "elastic_jobs": int(sum(1 for a, b in zip(self.wmin, self.wmax, strict=True) if b > a)),
        }
        return out
