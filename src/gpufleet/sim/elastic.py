"""The elastic simulator: two pools, inference servers loaned to training, jobs that grow and shrink (Aryl).

Time jumps between events: job arrivals and completions, changes of the inference load (which loan or
reclaim whole servers) and scheduling rounds every ``interval_s``. At every instant where something
changed, phase 1 admits waiting jobs' base demands shortest first, scaling in flexible workers when a
waiting job needs their GPUs. At each round, phase 2 gives the GPUs left over to elastic jobs through
the policy's knapsack. A job's progress rate is ``T(effective workers) / T(base workers)`` from the
scaling curve, where a worker on a loaned server counts ``loan_speed`` of a training-server worker; every
change of a running job's workers pauses it for ``scale_pause_s``; a job preempted by a reclaim returns
to the queue, loses the work since its last checkpoint and pays ``restart_s`` when it resumes.
"""

from __future__ import annotations

import heapq
import math
import time
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from gpufleet.sched.aryl import ArylPolicy
from gpufleet.sim.config import SimConfig
from gpufleet.sim.elastic_jobs import ElasticConfig, assign_elastic, loan_speed_from_catalog
from gpufleet.sim.features.base import Feature, overrides
from gpufleet.sim.features.inference import PoolGPUs, usage_over_window
from gpufleet.sim.frames import job_frame, timeline_frame
from gpufleet.sim.jobstate import DONE, PENDING, RUNNING, UNSCHEDULABLE, WAITING, checkpoint_kept
from gpufleet.sim.metrics import summarize, time_weighted_mean
from gpufleet.sim.result import SimResult
from gpufleet.sim.scaling import PowerLawCurve, ScalingCurve
from gpufleet.sim.servers import DOWN, HELD, LOANED, TRAINING, Servers
from gpufleet.sim.workload import Workload

if TYPE_CHECKING:
    from gpufleet.sim.failures import OutagePlan

_INF = math.inf


class ElasticSimulator:
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
        self.config = config or SimConfig()
        self.ecfg = elastic or ElasticConfig()
        self.policy = policy
        jobs = jobs.sort("submit_s", maintain_order=True)
        self.workload = Workload.from_frame(jobs)
        w = self.workload
        n = len(w)
        self.n = n
        training = cluster.training_pools
        if not training:
            from gpufleet.errors import SpecError

            raise SpecError(f"cluster '{cluster.name}' has no training pool")
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
        self.curve = curve or PowerLawCurve()
        self.curve_of = self._job_curves(jobs, training[0])
        self.submit: list[float] = w.submit.tolist()
        self.duration: list[float] = w.duration.tolist()
        self.gpus = [g * m for g, m in zip(self.g, self.wmin, strict=True)]
        self.state = [PENDING] * n
        self.remaining: list[float] = list(self.duration)
        self.seg_start = [0.0] * n
        self.seg_over = [0.0] * n
        self.rate = [1.0] * n
        self.base_rate_t = [c.throughput(m) for c, m in zip(self.curve_of, self.wmin, strict=True)]
        self.held_s = [0.0] * n
        self.first_start = [math.nan] * n
        self.finish = [math.nan] * n
        self.preemptions = [0] * n
        self.scale_events = [0] * n
        self.lost = [0.0] * n
        self.restarts = [0] * n  # resumes from a checkpoint: reclaims, failures and drains
        self._penalty: dict[int, float] = {}  # extra restore time of a job's next start (a drain's checkpoint)
        self.resumed_at = [0.0] * n  # progress the current run resumed from (a checkpoint, or the start)
        self.nbase = [0] * n
        self.nflex = [0] * n
        self.where: list[dict[int, None]] = [{} for _ in range(n)]
        self._ver = [0] * n
        self._events: list[tuple] = []
        self._seq = 0
        self._waiting: dict[tuple, list[tuple]] = {}
        self._wver = [0] * n
        self.running: dict[int, None] = {}
        self.n_waiting = 0
        self.busy = 0
        self.busy_loaned = 0  # GPUs training holds on loaned servers
        self.eff = [0.0] * n  # effective workers (loaned-server workers count loan_speed)
        self.eff_flex = [0.0] * n
        self.counters = {"reclaims": 0, "reclaim_preemptions": 0, "scale_events": 0}
        self.events_processed = 0
        self.inf_needed = len(self.srv.inference_ids)
        self._masks: dict[tuple[str | None, bool], np.ndarray] = {}
        self._type_of: list[str | None] = [t.lower() if isinstance(t, str) else None for t in w.gpu_type]
        self._resolve_schedulable()
        self._tl = {
            k: array("d")
            for k in ("t", "busy", "loaned_used", "loaned", "loaned_gpus", "inference", "needed", "queued", "running")
        }
        # the first server of each training pool, in the order of gpufleet.sim.workload.partitions_for
        starts = np.cumsum([0] + [p.nodes for p in cluster.pools]).tolist()
        self._part_server = [
            first for first, pool in zip(starts[:-1], cluster.pools, strict=True) if pool.kind == "training"
        ]
        # features (gpufleet.sim.features): loaning and reclaiming follow the inference load, knapsack rounds
        # scale elastic jobs, node outages come from a fleet; the core calls each through the hooks it overrides
        feats: list[Feature] = []
        if self.inference is not None:
            from gpufleet.sim.features.loaning import InferenceLoans

            feats.append(InferenceLoans(self.inference, self.ecfg.reclaim_notice_s))
        if policy.elastic:
            from gpufleet.sim.features.knapsack import KnapsackRounds

            feats.append(KnapsackRounds(self.ecfg.interval_s))
        feats.extend(features or ())
        self.outages = outages
        if outages is not None:
            from gpufleet.sim.features.outages import OutageFeature

            feats.append(OutageFeature(outages))
        self.features = feats
        for f in feats:
            f.bind(self)
        self._timed = [f for f in feats if overrides(f, "next_time")]
        self._pass_hooks = [f.end_pass for f in feats if overrides(f, "end_pass")]
        self._stepped = [f for f in feats if overrides(f, "end_step")]
        policy.bind(self)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ setup
    def _job_curves(self, jobs: pl.DataFrame, pool: Any) -> list[ScalingCurve]:
        """Per job: the ``perf`` model's curve when its ``model`` column names a catalog model, else the default."""
        n = len(self.workload)
        if "model" not in jobs.columns:
            return [self.curve] * n
        from gpufleet.errors import ConfigError, GpufleetError
        from gpufleet.sim.scaling import PerfCurve

        cache: dict[tuple[str, int], ScalingCurve] = {}
        out: list[ScalingCurve] = []
        for j, name in enumerate(jobs["model"].cast(pl.Utf8).to_list()):
            if not name:
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

    def _resolve_schedulable(self) -> None:
        """Jobs whose base demand fits no training pool are reported and never queued."""
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

    # ------------------------------------------------------------------ progress
    def progress_now(self, j: int, now: float) -> float:
        """Base-demand work job ``j`` has done in its current segment."""
        p = (now - self.seg_start[j] - self.seg_over[j]) * self.rate[j]
        return 0.0 if p <= 0.0 else min(p, self.remaining[j])

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

    def _take_all_on(self, s: int, j: int) -> None:
        b, f = self.srv.occ[s][j]
        for _ in range(b):
            self._take(s, j, False)
        for _ in range(f):
            self._take(s, j, True)

    def _close_segment(self, j: int, now: float) -> None:
        prog = self.progress_now(j, now)
        held = now - self.seg_start[j]
        self.held_s[j] += held
        self.remaining[j] -= prog
        self.seg_over[j] = max(0.0, self.seg_over[j] - held)
        self.seg_start[j] = now

    def _new_segment(self, j: int, now: float, pause: float) -> None:
        """Start a segment with the job's current workers; schedule its completion."""
        self.seg_start[j] = now
        self.seg_over[j] = max(self.seg_over[j], pause)
        self.rate[j] = self.curve_of[j].throughput(self.eff[j]) / self.base_rate_t[j]
        fin = now + self.seg_over[j] + self.remaining[j] / self.rate[j]
        self._ver[j] += 1
        self._seq += 1
        heapq.heappush(self._events, (fin, 0, self._seq, j, self._ver[j]))

    def _rescaled(self, j: int, now: float) -> None:
        """Job ``j``'s workers changed while it ran: account the old segment, pause, continue."""
        self.scale_events[j] += 1
        self.counters["scale_events"] += 1
        self._new_segment(j, now, self.ecfg.scale_pause_s)

    # ------------------------------------------------------------------ waiting queue
    def _push_waiting(self, j: int) -> None:
        key = self.policy.waiting_key(j, 0.0)
        ck = (self.wmin[j], self.g[j], self._type_of[j] or "")
        h = self._waiting.setdefault(ck, [])
        self._seq += 1
        heapq.heappush(h, (key, self._seq, j, self._wver[j]))

    def _head(self, ck: tuple) -> tuple | None:
        h = self._waiting[ck]
        while h and (h[0][3] != self._wver[h[0][2]] or self.state[h[0][2]] != WAITING):
            heapq.heappop(h)
        return h[0] if h else None

    # ------------------------------------------------------------------ placement
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
        self._start(j, now)
        return True

    def _start(self, j: int, now: float) -> None:
        self._wver[j] += 1
        self.state[j] = RUNNING
        self.n_waiting -= 1
        self.running[j] = None
        if self.first_start[j] != self.first_start[j]:
            self.first_start[j] = now
        self.seg_over[j] = 0.0
        pause = self.config.restart_s if self.restarts[j] else 0.0
        if self._penalty:
            pause += self._penalty.pop(j, 0.0)
        self._new_segment(j, now, pause)

    # ------------------------------------------------------------------ phase 1
    def _phase1(self, now: float) -> None:
        if not self.n_waiting:
            return
        heads = []
        for ck in list(self._waiting):
            e = self._head(ck)
            if e is not None:
                heads.append((e, ck))
        heads.sort()
        while heads:
            entry, ck = heads.pop(0)
            j = entry[2]
            if self._admit(j, now):
                e = self._head(ck)
                if e is not None:
                    heads.append((e, ck))
                    heads.sort()
            # a class whose best job does not fit is skipped: its other jobs are the same size

    # ------------------------------------------------------------------ phase 2
    # ------------------------------------------------------------------ servers changing hands
    def _move(self, servers: np.ndarray, group: int) -> None:
        """Hand empty ``servers`` to ``group`` (LOANED or HELD); the cached placement masks go stale."""
        self.srv.move(servers, group)
        self._masks.clear()

    def _checkpointed(self, j: int, done: float) -> float:
        """Progress job ``j`` keeps of ``done`` when stopped now: its last checkpoint, never behind its resume."""
        return checkpoint_kept(self.resumed_at[j], done, self.config.checkpoint_interval_s)

    def evict(
        self,
        j: int,
        now: float,
        lossy: bool,
        preempted: bool = False,
        before_requeue: Callable[[int], None] | None = None,
    ) -> tuple[float, float]:
        """Stop running ``j`` and queue it again: ``lossy`` rolls it back to its last checkpoint, else it keeps
        all its progress. It pays ``restart_s`` when it resumes. Returns (progress made, progress kept)."""
        self._close_segment(j, now)
        self._release_all(j)
        del self.running[j]
        self._ver[j] += 1
        dur = self.duration[j]
        done = dur - self.remaining[j]
        kept = done
        if lossy:
            kept = self._checkpointed(j, done)
            self.lost[j] += done - kept
            self.remaining[j] = dur - kept
        self.resumed_at[j] = dur - self.remaining[j]
        if preempted:
            self.preemptions[j] += 1
        if before_requeue is not None:
            before_requeue(j)
        self.restarts[j] += 1
        self.seg_over[j] = 0.0
        self.state[j] = WAITING
        self.n_waiting += 1
        self._wver[j] += 1
        self._push_waiting(j)
        return done, kept

    # ------------------------------------------------------------------ core primitives for features
    def _server(self, p: int, node: int) -> int:
        return int(self._part_server[p]) + node

    def jobs_on_node(self, p: int, node: int) -> list[int]:
        """The running jobs with a worker on node ``node`` of training pool ``p``."""
        return list(self.srv.occ[self._server(p, node)])

    def add_restore(self, j: int, seconds: float) -> None:
        """``j`` spends ``seconds`` more restoring on its next start (e.g. a drain's checkpoint save)."""
        self._penalty[j] = self._penalty.get(j, 0.0) + seconds

    def node_down(self, p: int, node: int) -> None:
        """Node ``node`` of training pool ``p`` (emptied by the caller) goes out of service."""
        self._move(np.array([self._server(p, node)]), DOWN)

    def node_up(self, p: int, node: int) -> None:
        """Node ``node`` of training pool ``p`` is back in service."""
        self._move(np.array([self._server(p, node)]), TRAINING)

    def _finish(self, j: int, now: float) -> None:
        self._close_segment(j, now)
        self._release_all(j)
        del self.running[j]
        self.remaining[j] = 0.0
        self.state[j] = DONE
        self.finish[j] = now

    # ------------------------------------------------------------------ main loop
    def run(self) -> SimResult:
        """Simulate until every schedulable job has finished; Ctrl-C stops early with partial results."""
        wall0 = time.perf_counter()
        interrupted = False
        try:
            self._loop()
        except KeyboardInterrupt:
            interrupted = True
        return self._result(time.perf_counter() - wall0, interrupted)

    def _loop(self) -> None:
        n = self.n
        submit = self.submit
        state = self.state
        events = self._events
        a = 0
        count = 0
        timed = self._timed
        stepped = self._stepped
        pass_hooks = self._pass_hooks
        t_out = min((f.next_time() for f in timed), default=_INF)  # next external event (load, outages)
        while True:
            while a < n and state[a] == UNSCHEDULABLE:
                a += 1
            pending = a < n or self.running or self.n_waiting
            if not pending:
                break
            ta = submit[a] if a < n else _INF
            te = events[0][0] if events else _INF
            tr = min((f.wake_time() for f in stepped), default=_INF)
            t = min(ta, te, tr, t_out)
            if t == _INF:
                break
            t = max(t, 0.0) if t < 0 else t
            changed = False
            while events and events[0][0] <= t:
                _, _, _, j, ver = heapq.heappop(events)
                if ver == self._ver[j] and state[j] == RUNNING:
                    self._finish(j, t)
                    changed = True
            if t_out <= t:
                t_out = _INF
                for f in timed:
                    nxt = f.next_time()
                    if nxt <= t:
                        nxt = f.apply(t)
                    t_out = nxt if nxt < t_out else t_out
                changed = True
            while a < n and submit[a] <= t:
                if state[a] == PENDING:
                    state[a] = WAITING
                    self.n_waiting += 1
                    self._push_waiting(a)
                    changed = True
                a += 1
            if changed:
                for hook in pass_hooks:
                    hook(t)
                self._phase1(t)
            for f in stepped:
                f.end_step(t)
            count += 1
            self._record(t)
            if self.config.debug:
                self.check_invariants()
            if not self.running and not self.n_waiting and a >= n:
                break
        self.events_processed = count

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
        for j in list(self.running):  # unfinished runs count the time held so far
            self._close_segment(j, now)
        extra: dict[str, Any] = {"scale_events": self.scale_events, "max_workers": self.wmax, "min_workers": self.wmin}
        for f in self.features:
            extra.update(f.job_columns())
        jobs = job_frame(w, self.first_start, self.finish, np.array(self.held_s), self.preemptions, extra)
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
