"""The discrete-event simulator: arrivals, completions, preemptions and policy timers over node-level state.

Time jumps from event to event (no fixed round). Events at the same instant are applied together, then the
policy gets one scheduling pass. Per-job state lives in flat Python lists indexed by job number, which is
what a CPython hot loop reads fastest; heaps hold the event queue, the waiting jobs (one heap per
GPU-type and size class, so a pass never scans the whole queue) and the running jobs of each partition.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from array import array
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufleet.sched.placement.base import Placement
from gpufleet.sched.placement.consolidate import Consolidate
from gpufleet.sched.policy import Policy
from gpufleet.sim.config import SimConfig
from gpufleet.sim.features.base import Feature, overrides
from gpufleet.sim.frames import job_frame, timeline_frame
from gpufleet.sim.jobstate import DONE, PENDING, RUNNING, UNSCHEDULABLE, WAITING, checkpoint_kept
from gpufleet.sim.metrics import summarize
from gpufleet.sim.partition import Allocation, Partition
from gpufleet.sim.result import SimResult
from gpufleet.sim.workload import Workload

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpufleet.sim.failures import OutagePlan
    from gpufleet.sim.network import NetworkState

_INF = math.inf
# event kinds; at equal times completions go first (they free GPUs), then timers, then wakeups
_COMPLETE, _TIMER, _WAKEUP, _UNPROTECT = 0, 1, 2, 3
_COMPACT_MIN = 1024  # a heap is cleaned of stale entries only past this size (and twice its live entries)


def _event_live(event: tuple, ver: list[int], token: list[int], wakeup_seq: int) -> bool:
    """Whether an event can still change anything: a completion of the job's current run, a timer or
    protection end armed by its current start, or the latest wakeup. A stale one stays stale (versions only grow)."""
    _, kind, seq, j, x = event
    if kind == _COMPLETE:
        return x == ver[j]
    if kind == _TIMER:
        return x[0] == token[j]
    if kind == _UNPROTECT:
        return x == token[j]
    return seq == wakeup_seq


class Simulator:
    """One run of one policy over one workload on one cluster; call :meth:`run` once."""

    def __init__(
        self,
        workload: Workload,
        partitions: list[Partition],
        policy: Policy,
        config: SimConfig | None = None,
        outages: OutagePlan | None = None,
        network: NetworkState | None = None,
        features: list[Feature] | None = None,
    ) -> None:
        self.workload = workload
        self.parts = partitions
        self.policy = policy
        self.config = config or SimConfig()
        n = len(workload)
        self.n = n
        self.now = 0.0
        # static job data
        self.submit: list[float] = workload.submit.tolist()
        self.duration: list[float] = workload.duration.tolist()
        self.gpus: list[int] = workload.gpus.tolist()
        # dynamic job data
        self.state = [PENDING] * n
        self.remaining: list[float] = list(self.duration)
        self.attained = [0.0] * n  # GPU-seconds held before the current run segment
        self.held_s = [0.0] * n  # seconds held before the current run segment
        self.seg_start = [0.0] * n
        self.seg_over = [0.0] * n  # restore time at the start of the segment
        self.seg_speed = [1.0] * n
        # progress sub-segment: a running job's speed changes when the network contention on its links does
        self.pseg_start = [0.0] * n
        self.pseg_base = [0.0] * n
        self.expected_finish = [_INF] * n
        self._event_at = [_INF] * n  # time of each running job's pending completion event
        # a resumed job cannot be preempted again before it has restored and passed its next checkpoint:
        # without this, a preemptive policy with restore costs or lossy checkpoints can livelock
        self.protect_until = [-math.inf] * n  # a first start is never protected, at any time (even < 0)
        self.first_start = [math.nan] * n
        self.finish = [math.nan] * n
        self.preemptions = [0] * n
        self.useful = [0.0] * n  # progress made, counting work later lost
        self.lost = [0.0] * n  # progress rolled back to a checkpoint
        self.restarts = [0] * n  # resumes from a checkpoint: preemptions, failures and drains
        self.alloc: list[Allocation | None] = [None] * n
        self.part_of = [-1] * n
        self.token = [0] * n  # bumps on every start/preempt; stale timers carry an old token
        self._ver = [0] * n  # completion-event version
        self._wver = [0] * n  # waiting-entry version
        self._hver = [0] * n  # running-heap-entry version
        self._wkey = [0.0] * n
        # GPUs started, stopped or re-ranked so far: bounds how much room preemption can have gained since a
        # failed attempt, so an attempt that cannot succeed yet is skipped without walking the running heap
        self._churn = 0
        self._short = 0  # GPUs the last failed preemption search fell short by
        # heap-ranked preemptive policies keep each partition's possible victims on a heap (scan policies rank
        # them afresh, non-preemptive ones need none)
        self._heap_victims = policy.preemptive and not policy.scan_running
        # A pass that started nothing changes nothing, so the next one can only differ if GPUs were freed or
        # a job became a possible victim (churn) or a better job heads a queue: without either it is skipped.
        # Only where keys do not drift with time (heap-ranked policies) and the placement decides from the
        # cluster's state alone (no random draws).
        self._skip_futile = not policy.scan_running and policy.placer.deterministic
        # a placement that asks for passes of its own (``Placement.next_wakeup``) is asked after each pass
        placer = policy.placer
        self._placer_wake = placer.next_wakeup if type(placer).next_wakeup is not Placement.next_wakeup else None
        # the default placement is the partition's own allocator: call it without the two layers between
        direct = type(policy.placer) is Consolidate and type(policy).place is Policy.place
        self._place = self._allocate if direct else policy.place
        self._bound_never_grows = self._heap_victims and policy.bound_never_grows
        self._bounded_victims = self._heap_victims and policy.bounded_running_key
        self._static_victims = self._heap_victims and policy.static_running_key and not policy.bounded_running_key
        self._pass_churn = -1
        self._new_head = True
        self._scan_cache: tuple | None = None  # the last victim ranking of a scan policy, by (partition, time, churn)
        self._pfail: dict[int, tuple[int, int, int]] = {}
        # partitions a job may use, by its GPU type
        self._allowed = self._resolve_allowed()
        # queues
        self._events: list[tuple] = []
        self._seq = 0
        self._waiting: dict[tuple[int, int], list[tuple]] = {}
        self._class_of = [(0, 0)] * n
        self._class_keys: list[tuple[int, int]] = []
        self._requeued: set[tuple[int, int]] | None = None  # classes jobs were pushed to, while a pass watches
        # each waiting class's best current entry, kept between passes; a push that tops a class's heap or a job
        # leaving the queue (a start, a re-rank) marks its class for a fresh look
        self._head_of: dict[tuple[int, int], tuple] = {}
        self._dirty: set[tuple[int, int]] = set()
        self._running_heap: list[list[tuple]] = [[] for _ in partitions]
        # heap sizes past which stale entries are dropped (twice the live entries at the last clean-up)
        self._running_cap = [_COMPACT_MIN] * len(partitions)
        self._events_cap = _COMPACT_MIN
        self._running: list[dict[int, None]] = [{} for _ in partitions]
        self.busy = 0
        self.n_waiting = 0
        self.waiting_gpus = 0  # GPUs the waiting jobs ask for
        self.n_running = 0
        self.total_gpus = sum(p.total for p in partitions)
        self._wakeup_seq = -1
        self._wakeup_at = _INF
        self.events_processed = 0
        # timeline
        self._tl_t = array("d")
        self._tl_busy = array("q")
        self._tl_queued = array("q")
        self._tl_running = array("q")
        self._down = [0] * len(partitions)  # GPUs out of service (down nodes hold all theirs), per partition
        self._penalty: dict[int, float] = {}  # extra restore time of a job's next start (a drain's checkpoint)
        # features (gpufleet.sim.features): the core calls each through the hooks it overrides
        feats = list(features or ())
        # network contention between multi-node jobs (gpufleet.sim.network); None: jobs run at placement speed
        self.network = network
        if network is not None:
            from gpufleet.sim.features.network import NetworkFeature

            feats.append(NetworkFeature(network))
        self.outages = outages
        if outages is not None:
            from gpufleet.sim.features.outages import OutageFeature

            feats.append(OutageFeature(outages))
        self.features = feats
        for f in feats:
            f.bind(self)
        self._speed_hooks = [f.start_speed for f in feats if overrides(f, "start_speed")]
        self._stop_hooks = [f.on_stop for f in feats if overrides(f, "on_stop")]
        self._pass_hooks = [f.end_pass for f in feats if overrides(f, "end_pass")]
        self._timed = [f for f in feats if overrides(f, "next_time")]
        self._stepped = [f for f in feats if overrides(f, "end_step")]
        policy.bind(self)

    # ------------------------------------------------------------------ setup
    def _resolve_allowed(self) -> list[tuple[int, ...]]:
        """Per job, the partitions it may run on; jobs that fit nowhere are marked unschedulable."""
        by_type: dict[str | None, tuple[int, ...]] = {None: tuple(range(len(self.parts)))}
        for i, p in enumerate(self.parts):
            by_type.setdefault(p.gpu_type, ())
            by_type[p.gpu_type] = (*by_type[p.gpu_type], i)
        self.unschedulable: dict[str, int] = {}
        allowed: list[tuple[int, ...]] = []
        for j, t in enumerate(self.workload.gpu_type):
            key = t.lower() if isinstance(t, str) else None
            choice = by_type.get(key, ())
            if not choice:
                reason = f"no training pool of GPU type '{t}'"
            elif self.gpus[j] > max(self.parts[i].total for i in choice):
                reason = "needs more GPUs than its pool has"
                choice = ()
            else:
                reason = ""
            if reason:
                self.state[j] = UNSCHEDULABLE
                self.unschedulable[reason] = self.unschedulable.get(reason, 0) + 1
            allowed.append(choice)
        return allowed

    # ------------------------------------------------------------------ API for policies
    def attained_now(self, j: int, now: float) -> float:
        """GPU-seconds job ``j`` has held up to ``now`` (its attained service)."""
        if self.state[j] == RUNNING:
            return self.attained[j] + (now - self.seg_start[j]) * self.gpus[j]
        return self.attained[j]

    def progress_now(self, j: int, now: float) -> float:
        """Work done by running job ``j`` in its current segment."""
        p = (now - self.pseg_start[j] - self.seg_over[j]) * self.seg_speed[j]
        p = self.pseg_base[j] + (p if p > 0.0 else 0.0)
        return p if p < self.remaining[j] else self.remaining[j]

    def worker_gpus(self, j: int) -> int:
        """GPUs a node's share of job ``j`` must be a multiple of: 1, a gang job splits over nodes freely."""
        return 1

    def add_timer(self, when: float, j: int, tag: int) -> None:
        """Call ``policy.on_timer(j, tag, when)`` at ``when`` unless ``j`` starts or stops first."""
        self._seq += 1
        heapq.heappush(self._events, (when, _TIMER, self._seq, j, (self.token[j], tag)))

    def rekey_waiting(self, j: int) -> None:
        """Re-rank waiting job ``j`` after its policy state changed (e.g. a Tiresias promotion)."""
        if self.state[j] == WAITING:
            self._wver[j] += 1
            self._dirty.add(self._class_of[j])
            self._push_waiting(j)

    def rekey_running(self, j: int) -> None:
        """Re-rank running job ``j`` among its partition's running jobs (e.g. a Tiresias demotion)."""
        if self.state[j] == RUNNING:
            if self.protect_until[j] <= self.now and self._gives_room(j):
                self._churn += self.gpus[j]
            self._push_running(j)

    def _gives_room(self, j: int) -> bool:
        """Whether running job ``j``, now a possible victim, could make room for a waiting job.

        Where a running job's bound never grows on its own (``bound_never_grows``), a job that the best waiting
        job does not beat now gives way to no job waiting now, ever: the room for preemption did not grow, and a
        pass run for it alone would change nothing (arrivals and re-ranked waiting jobs bring their own pass).
        """
        if not self._bound_never_grows:
            return True
        best = self.best_waiting_key()
        pol = self.policy
        return best is not None and pol.should_preempt(pol.running_bound(j, self.now), best)

    def best_waiting_key(self) -> float | None:
        """The key of the best waiting job over all classes, or None when nothing waits."""
        head_of = self._fresh_heads()
        return min(head_of.values())[0] if head_of else None  # entries are (key, seq, ...): least key first

    def jobs_on_node(self, p: int, node: int) -> list[int]:
        """The running jobs of partition ``p`` that hold GPUs of node ``node``."""
        alloc = self.alloc
        return [j for j in self._running[p] if any(n == node for n, _ in alloc[j] or ())]  # running: never None

    def running_jobs(self) -> list[int]:
        """Every running job (all partitions)."""
        out: list[int] = []
        for r in self._running:
            out.extend(r)
        return out

    # ------------------------------------------------------------------ queues
    def _push_waiting(self, j: int) -> None:
        key = self.policy.waiting_key(j, self.now)
        self._wkey[j] = key
        ck = self._class_of[j]
        h = self._waiting.get(ck)
        if h is None:
            h = self._waiting[ck] = []
            self._class_keys.append(ck)
            self._class_keys.sort()
        self._seq += 1
        heapq.heappush(h, (key, self._seq, j, self._wver[j]))
        if h[0][2] == j:
            self._new_head = True
            self._dirty.add(ck)
        if self._requeued is not None:
            self._requeued.add(ck)

    def _push_running(self, j: int) -> None:
        self._hver[j] += 1
        if self.protect_until[j] > self.now:
            return  # not a possible victim yet: its _UNPROTECT event pushes it (keeps victim searches short)
        self._seq += 1
        p = self.part_of[j]
        h = self._running_heap[p]
        heapq.heappush(h, (-self.policy.running_order_key(j, self.now), self._seq, j, self._hver[j]))
        if len(h) > self._running_cap[p]:
            self._compact_running(p)

    def _compact_running(self, p: int) -> None:
        """Drop the entries of jobs that stopped or were re-ranked from partition ``p``'s victim heap.

        Stale entries leave a heap only when they reach its top, and on Philly most never do: without this the
        heap holds about 200 entries per running job. Dropping them keeps the order of the live ones.
        """
        hver = self._hver
        h = self._running_heap[p]
        h[:] = [e for e in h if e[3] == hver[e[2]]]
        heapq.heapify(h)
        self._running_cap[p] = max(2 * len(h), _COMPACT_MIN)

    def _compact_events(self) -> None:
        """Drop events that went stale from the event heap; live ones keep their order."""
        ver, token, wake = self._ver, self.token, self._wakeup_seq
        live = [e for e in self._events if _event_live(e, ver, token, wake)]
        heapq.heapify(live)
        self._events[:] = live
        self._events_cap = max(2 * len(live), _COMPACT_MIN)

    # ------------------------------------------------------------------ transitions
    def _arrive(self, j: int) -> None:
        self.state[j] = WAITING
        t = self.workload.gpu_type[j]
        self._class_of[j] = (0 if t is None else 1 + self._allowed[j][0], self.gpus[j])
        self.n_waiting += 1
        self.waiting_gpus += self.gpus[j]
        self._push_waiting(j)

    def _start(self, j: int, p: int, alloc: Allocation, now: float) -> None:
        part = self.parts[p]
        g = self.gpus[j]
        cfg = self.config
        self._wver[j] += 1
        self._dirty.add(self._class_of[j])
        self.n_waiting -= 1
        self.waiting_gpus -= g
        self.state[j] = RUNNING
        self.alloc[j] = alloc
        self.part_of[j] = p
        speed = 1.0 if len(alloc) <= part.ideal_nodes(g) else 1.0 - cfg.placement_penalty
        for hook in self._speed_hooks:
            speed = hook(j, p, alloc, speed)
        resumed = self.restarts[j]
        over = cfg.restart_s if resumed else 0.0
        if self._penalty:
            over += self._penalty.pop(j, 0.0)
        self.seg_start[j] = now
        self.pseg_start[j] = now
        self.pseg_base[j] = 0.0
        self.seg_over[j] = over
        self.seg_speed[j] = speed
        if self.first_start[j] != self.first_start[j]:  # NaN: first start
            self.first_start[j] = now
        remaining = self.remaining[j]
        fin = now + over + remaining / speed
        self.expected_finish[j] = fin
        ver = self._ver[j] + 1
        self._ver[j] = ver
        seq = self._seq + 1
        self._event_at[j] = fin
        events = self._events
        heapq.heappush(events, (fin, _COMPLETE, seq, j, ver))
        token = self.token[j]
        if resumed and self.policy.preemptive:
            ci = cfg.checkpoint_interval_s
            done = self.duration[j] - remaining
            need = (math.floor(done / ci) * ci + ci - done) if ci > 0 else over
            until = now + over + need / speed
            until = fin if fin < until else until
            self.protect_until[j] = until
            if until > now:
                seq += 1
                # versioned by the start token: a speed change (new completion version) must not drop it;
                # armed even at the completion time, since a slowdown can move the completion later
                heapq.heappush(events, (until, _UNPROTECT, seq, j, token + 1))
        self._seq = seq
        self._running[p][j] = None
        if self._heap_victims:
            self._push_running(j)
        self.busy += g
        self._churn += g
        self.n_running += 1
        self.token[j] = token + 1
        self.policy.on_start(j, now)

    def _stop_segment(self, j: int, now: float) -> float:
        """Close the running segment of ``j`` at ``now``; returns the progress it made."""
        prog = self.progress_now(j, now)
        for hook in self._stop_hooks:
            hook(j, now)
        held = now - self.seg_start[j]
        self.held_s[j] += held
        self.attained[j] += held * self.gpus[j]
        self.useful[j] += prog
        self._release_placement(j)
        self._ver[j] += 1
        self.n_running -= 1
        self.token[j] += 1
        return prog

    def _release_placement(self, j: int) -> None:
        """Give back the GPUs that stopping job ``j`` held (a placement subclass releases its own way)."""
        p = self.part_of[j]
        self.parts[p].release(self.alloc[j])  # type: ignore[arg-type]
        self.alloc[j] = None
        del self._running[p][j]
        self._hver[j] += 1
        self.busy -= self.gpus[j]
        self._churn += self.gpus[j]

    def change_speed(self, k: int, now: float, new: float) -> None:
        """Running job ``k`` goes on at speed ``new`` from ``now``: bank its progress, move its completion."""
        base = self.progress_now(k, now)
        planned = self.expected_finish[k]
        over = self.seg_over[k] - (now - self.pseg_start[k])
        over = over if over > 0.0 else 0.0
        self.pseg_start[k] = now
        self.pseg_base[k] = base
        self.seg_over[k] = over
        self.seg_speed[k] = new
        fin = now + over + (self.remaining[k] - base) / new
        self.expected_finish[k] = fin
        # slower than planned: the pending completion event fires early and re-arms itself, so a job slowed
        # many times costs one heap entry, not one per change
        if fin < self._event_at[k]:
            self._ver[k] += 1
            self._seq += 1
            self._event_at[k] = fin
            heapq.heappush(self._events, (fin, _COMPLETE, self._seq, k, self._ver[k]))
        if self._heap_victims:
            # a bound that reads the finish time grew: the job may now give way where it did not
            if self._bounded_victims and fin > planned and self.protect_until[k] <= now and self._gives_room(k):
                self._churn += self.gpus[k]
            self._push_running(k)

    def _preempt(self, j: int, now: float) -> None:
        self.evict(j, now, lossy=True, preempted=True)

    def evict(
        self,
        j: int,
        now: float,
        lossy: bool,
        preempted: bool = False,
        before_requeue: Callable[[int], None] | None = None,
    ) -> tuple[float, float]:
        """Stop running ``j`` and queue it again: ``lossy`` rolls it back to its last checkpoint (a preemption,
        a failure), else it keeps all its progress (a checkpoint first, as a drain takes). It pays
        ``restart_s`` when it resumes. Returns (progress made, progress kept)."""
        prog = self._stop_segment(j, now)
        dur = self.duration[j]
        before = dur - self.remaining[j]  # resumed from here: a checkpoint (or the start)
        done = before + prog
        kept = checkpoint_kept(before, done, self.config.checkpoint_interval_s) if lossy else done
        self.lost[j] += done - kept
        self.remaining[j] = dur - kept
        if preempted:
            self.preemptions[j] += 1
        if before_requeue is not None:
            before_requeue(j)
        self.restarts[j] += 1
        self.state[j] = WAITING
        self.n_waiting += 1
        self.waiting_gpus += self.gpus[j]
        self._push_waiting(j)
        self.policy.on_preempt(j, now)
        return done, kept

    def add_restore(self, j: int, seconds: float) -> None:
        """``j`` spends ``seconds`` more restoring on its next start (e.g. a drain's checkpoint save)."""
        self._penalty[j] = self._penalty.get(j, 0.0) + seconds

    def node_down(self, p: int, node: int) -> None:
        """Node ``node`` of partition ``p`` (emptied by the caller) goes out of service: it looks fully busy."""
        part = self.parts[p]
        part._take(node, part.gpus_per_node)
        part.total_free -= part.gpus_per_node
        self._down[p] += part.gpus_per_node

    def node_up(self, p: int, node: int) -> None:
        """Node ``node`` of partition ``p`` is back in service."""
        part = self.parts[p]
        part.release([(node, part.gpus_per_node)])
        self._down[p] -= part.gpus_per_node
        self._churn += part.gpus_per_node  # room for preemption grew

    def _finish(self, j: int, now: float) -> None:
        prog = self._stop_segment(j, now)
        self.useful[j] += self.remaining[j] - prog  # the last segment did exactly the remaining work
        self.remaining[j] = 0.0
        self.state[j] = DONE
        self.finish[j] = now

    # ------------------------------------------------------------------ scheduling pass
    def _allocate(self, j: int, p: int, part: Partition) -> Allocation | None:
        """What ``consolidate`` places: the run's allocation setting on the partition (``Consolidate.place``)."""
        cfg = self.config
        return part.allocate(self.gpus[j], cfg.placement, cfg.strict_placement)

    def _try_place(self, j: int) -> bool:
        place = self._place
        for p in self._allowed[j]:
            alloc = place(j, p, self.parts[p])
            if alloc is not None:
                self._start(j, p, alloc, self.now)
                return True
        return False

    def _victims_heap(self, p: int, wkey: float, now: float):
        """Running jobs of partition ``p`` worse than ``wkey``, worst first, popped lazily from the heap.

        With a bounded key (SRTF: the heap is ordered by remaining time, the test is on remaining work) the
        search stops at the first job whose bound does not qualify; jobs passed over on the way go back on the
        heap when the search ends or is closed.
        """
        h = self._running_heap[p]
        pol = self.policy
        hver = self._hver
        static = pol.static_running_key
        bounded = pol.bounded_running_key
        passed: list[tuple] = []
        try:
            while h:
                entry = h[0]
                j = entry[2]
                if entry[3] != hver[j]:
                    heapq.heappop(h)
                    continue
                # running_bound is running_key unless the policy bounds it; a static key is the heap key itself
                bound = -entry[0] if static and not bounded else pol.running_bound(j, now)
                if not pol.should_preempt(bound, wkey):
                    return
                heapq.heappop(h)
                if bounded and not pol.should_preempt(pol.running_key(j, now), wkey):
                    passed.append(entry)
                    continue
                yield j, entry  # never a protected job: those join the heap at their _UNPROTECT event
        finally:
            for entry in passed:
                heapq.heappush(h, entry)

    def _any_victim(self, j: int) -> bool:
        """Whether a running job on one of ``j``'s partitions is worse than it: the best victim of each heap
        (stale entries dropped on the way) decides, as the victim search's first step would."""
        pol = self.policy
        wkey = self._wkey[j]
        hver = self._hver
        plain = self._static_victims
        for p in self._allowed[j]:
            h = self._running_heap[p]
            while h and h[0][3] != hver[h[0][2]]:
                heapq.heappop(h)
            if h:
                bound = -h[0][0] if plain else pol.running_bound(h[0][2], self.now)
                if pol.should_preempt(bound, wkey):
                    return True
        return False

    def _victims_scan(self, p: int, wkey: float, now: float):
        """Running jobs of partition ``p`` worse than ``wkey``, worst first, ranked by a vectorised scan."""
        pol = self.policy
        stamp = (p, now, self._churn)
        cached = self._scan_cache
        if cached is not None and cached[0] == stamp:
            running, keys, order = cached[1]  # nothing started or stopped since: same ranking
        else:
            running = list(self._running[p])
            if not running:
                return
            keys = pol.running_keys(np.fromiter(running, dtype=np.int64, count=len(running)), now)
            order = np.argsort(-keys, kind="stable").tolist()
            self._scan_cache = (stamp, (running, keys, order))
        protect = self.protect_until
        for i in order:
            if not pol.should_preempt(float(keys[i]), wkey):
                return
            if protect[running[i]] > now:
                continue
            yield running[i], None

    def _preempt_for(self, j: int) -> bool:
        """Preempt worse running jobs so that ``j`` fits; False (and nothing changed) when it cannot."""
        g = self.gpus[j]
        wkey = self._wkey[j]
        now = self.now
        cfg = self.config
        scan = self.policy.scan_running
        memo = self._pfail.get(j)
        if memo is not None and memo[0] == self._wver[j] and self._churn - memo[1] < memo[2]:
            self._short = memo[2] - (self._churn - memo[1])  # the room grew by at most the churn since
            return False
        deficit = g
        for p in self._allowed[j]:
            part = self.parts[p]
            if g > part.total:
                continue
            chosen: list[tuple[int, Any]] = []
            freed = 0
            gen = self._victims_scan(p, wkey, now) if scan else self._victims_heap(p, wkey, now)
            for v, entry in gen:
                chosen.append((v, entry))
                freed += self.gpus[v]
                if part.total_free + freed >= g:
                    break
            if part.total_free + freed < g:
                gen.close()  # jobs a bounded search passed over go back on the heap
                deficit = min(deficit, g - part.total_free - freed)
                if not scan:
                    for _, entry in chosen:
                        heapq.heappush(self._running_heap[p], entry)
                continue
            for v, _ in chosen:
                self._preempt(v, now)
            placer = self.policy.placer
            placer.may_wait = False  # jobs were preempted for this one: its placement must not hold it back
            try:
                alloc = self._place(j, p, part)
                while alloc is None and cfg.strict_placement:  # free more until a compact placement exists
                    extra = next(gen, None)
                    if extra is None:
                        break
                    self._preempt(extra[0], now)
                    alloc = self._place(j, p, part)
            finally:
                placer.may_wait = True
            gen.close()
            if alloc is not None:
                self._start(j, p, alloc, now)
                return True
        if not scan:  # scanned keys drift with time, so only heap-ranked policies may skip retries
            self._pfail[j] = (self._wver[j], self._churn, max(deficit, 1))
        self._short = max(deficit, 1)
        return False

    def _head(self, ck: tuple[int, int]) -> tuple | None:
        """The best current entry of waiting class ``ck``, dropping stale entries on the way."""
        h = self._waiting[ck]
        wver = self._wver
        while h and h[0][3] != wver[h[0][2]]:
            heapq.heappop(h)
        return h[0] if h else None

    def _fresh_heads(self) -> dict[tuple[int, int], tuple]:
        """Each waiting class's best current entry, looking again only at the classes marked since."""
        head_of = self._head_of
        if self._dirty:
            for ck in self._dirty:
                e = self._head(ck)
                if e is None:
                    head_of.pop(ck, None)
                else:
                    head_of[ck] = e
            self._dirty.clear()
        return head_of

    def _heads(self) -> list[tuple]:
        """(best entry, class) of every class with a waiting job, best first."""
        heads = [(e, ck) for ck, e in self._fresh_heads().items()]
        heads.sort()
        return heads

    def _total_free(self) -> int:
        """GPUs free now over every partition (the pass's budget for starting jobs without preemption)."""
        parts = self.parts
        return parts[0].total_free if len(parts) == 1 else sum(p.total_free for p in parts)

    def _schedule(self) -> None:
        """One scheduling pass: start waiting jobs best first; a class whose best job cannot start is
        skipped for the rest of the pass (its other jobs are worse and the same size)."""
        if not self.n_waiting:
            return
        pol = self.policy
        preemptive = pol.preemptive
        gpus = self.gpus
        heads = self._heads()
        blocked: set[tuple[int, int]] = set()
        parts = self.parts
        single = len(parts) == 1
        free_now = self._total_free()
        fail_g = 1 << 62  # preempting for a job this large already failed in this pass
        # per set of allowed partitions, until the next successful preemption: heads come best first, so a later
        # job's victims (running jobs worse than it) are a subset of an earlier one's, and once preempting for
        # g GPUs fell ``_short`` GPUs short, a later job needing g - _short + 1 or more cannot win either (a pure
        # shortcut: it skips only searches that would fail)
        short_g: dict[tuple[int, ...], int] = {}
        while heads:
            entry, ck = heads.pop(0)
            j = entry[2]
            g = gpus[j]
            if g <= free_now and self._try_place(j):
                free_now = self._total_free()
                e = self._head(ck)
                if e is not None:
                    bisect.insort(heads, (e, ck))
                continue
            # a placement that chose to hold the job for a better slot is not overruled by preempting for it
            allowed = self._allowed[j]
            if (
                preemptive
                and g < fail_g
                and g < short_g.get(allowed, fail_g)
                and not (g <= free_now and pol.placer.waited)
            ):
                if self._heap_victims and not self._any_victim(j):  # the search would find no job to preempt
                    short = g - free_now if single else min(g - parts[p].total_free for p in allowed)
                    self._short = short if short > 1 else 1
                else:
                    self._requeued = requeued = {ck}  # j's own class: its head started
                    try:
                        won = self._preempt_for(j)
                    finally:
                        self._requeued = None
                    if won:
                        # victims went back to the queue: refresh the heads of the classes they joined (and
                        # j's), keeping blocked classes out; no other class's head moved
                        free_now = self._total_free()
                        requeued -= blocked
                        heads = [h for h in heads if h[1] not in requeued]
                        for rk in requeued:
                            e = self._head(rk)
                            if e is not None:
                                bisect.insort(heads, (e, rk))
                        short_g.clear()  # victims worse than this job but better than later ones freed GPUs
                        continue
                fail_g = g
                short_g[allowed] = min(short_g.get(allowed, g), g - self._short + 1)
            if pol.blocking:
                return
            blocked.add(ck)
            if single and free_now == 0 and (not preemptive or min(fail_g, short_g.get(allowed, fail_g)) <= 1):
                return  # no free GPU and nothing left to preempt for any later (worse) head: the pass is over

    # ------------------------------------------------------------------ main loop
    def run(self) -> SimResult:
        """Simulate until every schedulable job has finished; Ctrl-C stops early with partial results."""
        wall0 = time.perf_counter()
        interrupted = False
        progress = _ProgressBar(self) if self.config.progress else None
        try:
            self._loop(progress)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if progress is not None:
                progress.close()
        wall = time.perf_counter() - wall0
        return self._result(wall, interrupted)

    def _loop(self, progress: _ProgressBar | None) -> None:
        events = self._events
        submit = self.submit
        state = self.state
        pol = self.policy
        debug = self.config.debug
        heappop = heapq.heappop
        heappush = heapq.heappush
        n = self.n
        a = 0
        ver = self._ver
        token = self.token
        count = 0
        timed = self._timed
        pass_hooks = self._pass_hooks
        stepped = self._stepped
        t_out = min((f.next_time() for f in timed), default=_INF)  # next external event (outages, load)
        record = self._record
        tl_t, tl_busy, tl_queued, tl_running = self._tl_t, self._tl_busy, self._tl_queued, self._tl_running
        if type(self)._record is not Simulator._record:
            tl_t = None  # a subclass records its own timeline
        while True:
            while a < n and state[a] == UNSCHEDULABLE:
                a += 1
            if a >= n and not self.n_running and not self.n_waiting:
                break  # every job is done: stale events and later outages or load changes are ignored
            ta = submit[a] if a < n else _INF
            if not stepped:
                # drop events that went stale (a stopped job's completion, timers and protection of an old run, a
                # replaced wakeup) before choosing the next time: a time with only those changes nothing, and
                # without per-step features it would cost a whole turn of this loop
                while events and not _event_live(events[0], ver, token, self._wakeup_seq):
                    heappop(events)
            if len(events) > self._events_cap:
                self._compact_events()
            te = events[0][0] if events else _INF
            t = ta if ta < te else te
            if stepped and (a < n or self.n_running or self.n_waiting):  # rounds while jobs remain
                tw = min(f.wake_time() for f in stepped)
                t = tw if tw < t else t
            if t >= t_out:  # an outage event comes first, or nothing else is left (then t is inf)
                if t_out == _INF or (t == _INF and not self.n_waiting):
                    break  # no job left to run: later outages are ignored
                t = t_out
            self.now = t
            changed = False  # stale events (a preempted job's old completion, old timers) change nothing
            while events and events[0][0] <= t:
                _, kind, seq, j, x = heappop(events)
                if kind == _COMPLETE:
                    if x == ver[j]:
                        if self.expected_finish[j] > t:  # slowed down since: not done yet, re-arm
                            fin = self.expected_finish[j]
                            self._event_at[j] = fin
                            self._seq += 1
                            heappush(events, (fin, _COMPLETE, self._seq, j, x))
                            continue
                        self._finish(j, t)
                        changed = True
                elif kind == _TIMER:
                    if x[0] == token[j]:
                        pol.on_timer(j, x[1], t)
                        changed = True
                elif kind == _UNPROTECT:
                    if x == token[j] and state[j] == RUNNING:
                        if self._gives_room(j):
                            self._churn += self.gpus[j]  # the job became a possible victim
                        if self._heap_victims:
                            self._push_running(j)
                        changed = True
                elif seq == self._wakeup_seq:
                    self._wakeup_at = _INF
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
                    self._arrive(a)
                    changed = True
                a += 1
            if changed:
                count += 1
                if self._new_head or self._churn != self._pass_churn or not self._skip_futile:
                    self._pass_churn = self._churn
                    self._new_head = False
                    self._schedule()
                for hook in pass_hooks:
                    hook(t)
                wake = pol.next_wakeup(t)
                if self._placer_wake is not None:
                    pw = self._placer_wake(t)
                    wake = pw if pw is not None and (wake is None or pw < wake) else wake
                if wake is not None and t < wake != self._wakeup_at:
                    self._seq += 1
                    self._wakeup_seq = self._seq
                    self._wakeup_at = wake
                    heapq.heappush(events, (wake, _WAKEUP, self._seq, -1, None))
            elif not stepped:
                continue
            for f in stepped:
                f.end_step(t)
            if tl_t is None:
                record(t)
            elif tl_t and tl_t[-1] == t:  # _record, inlined: one row per time
                tl_busy[-1] = self.busy
                tl_queued[-1] = self.n_waiting
                tl_running[-1] = self.n_running
            else:
                tl_t.append(t)
                tl_busy.append(self.busy)
                tl_queued.append(self.n_waiting)
                tl_running.append(self.n_running)
            if debug:
                self.check_invariants()
            if progress is not None and count >= progress.next_update:
                progress.update(t, count)
        self.events_processed = count

    def _record(self, t: float) -> None:
        tl_t = self._tl_t
        if tl_t and tl_t[-1] == t:
            self._tl_busy[-1] = self.busy
            self._tl_queued[-1] = self.n_waiting
            self._tl_running[-1] = self.n_running
            return
        tl_t.append(t)
        self._tl_busy.append(self.busy)
        self._tl_queued.append(self.n_waiting)
        self._tl_running.append(self.n_running)

    # ------------------------------------------------------------------ invariants (debug mode)
    def check_invariants(self) -> None:
        """Raise AssertionError if the cluster state is impossible (called on every event in debug mode)."""
        now = self.now
        held = 0
        running = 0
        for p, part in enumerate(self.parts):
            part.check()
            for j in self._running[p]:
                assert self.state[j] == RUNNING
                assert self.submit[j] <= now, f"job {j} runs before it arrives"
                held += self.gpus[j]
                running += 1
                assert sum(c for _, c in self.alloc[j] or ()) == self.gpus[j]
            assert part.total - part.total_free - self._down[p] == sum(self.gpus[j] for j in self._running[p])
        assert held == self.busy <= self.total_gpus, "more GPUs allocated than exist"
        if self._heap_victims:
            # every running job past its protection is a possible victim: it has a current heap entry
            for p, heap in enumerate(self._running_heap):
                live = {e[2] for e in heap if e[3] == self._hver[e[2]]}
                for j in self._running[p]:
                    assert self.protect_until[j] > now or j in live, f"running job {j} missing from victim heap"
        assert running == self.n_running
        for j in range(self.n):
            s = self.state[j]
            if s == DONE:
                # work conservation: progress made minus progress lost is exactly the job's work
                assert abs(self.useful[j] - self.lost[j] - self.duration[j]) <= 1e-6 * max(1.0, self.duration[j])
                assert self.finish[j] >= self.submit[j] + self.duration[j] - 1e-6
            elif s == WAITING:
                assert self.submit[j] <= now
            assert self.remaining[j] >= -1e-9

    # ------------------------------------------------------------------ results
    def _result(self, wall: float, interrupted: bool) -> SimResult:
        held = np.array(self.held_s)
        for j in range(self.n):
            if self.state[j] == RUNNING:  # unfinished runs count the time held so far
                held[j] += self.now - self.seg_start[j]
        extra: dict[str, Any] = {}
        for f in self.features:
            extra.update(f.job_columns())
        jobs = job_frame(self.workload, self.first_start, self.finish, held, self.preemptions, extra)
        timeline = timeline_frame(
            np.frombuffer(self._tl_t, dtype=np.float64),
            {
                "busy_gpus": np.frombuffer(self._tl_busy, dtype=np.int64),
                "queued_jobs": np.frombuffer(self._tl_queued, dtype=np.int64),
                "running_jobs": np.frombuffer(self._tl_running, dtype=np.int64),
            },
        )
        meta: dict[str, Any] = {
            "events": self.events_processed,
            "interrupted": interrupted,
            "unschedulable": dict(self.unschedulable),
            "lost_work_gpu_s": float(sum(lo * g for lo, g in zip(self.lost, self.gpus, strict=False))),
            "config": self.config,
        }
        summary = summarize(self.policy.name, jobs, timeline, self.total_gpus, wall, meta)
        for f in self.features:
            summary.update(f.summary(jobs, timeline))
        return SimResult(self.policy.name, summary, jobs, timeline, self.total_gpus, meta)


class _ProgressBar:
    """A Rich progress bar over simulated time, refreshed every few thousand events."""

    def __init__(self, sim: Simulator) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.end = float(sim.submit[-1]) if sim.n else 1.0
        self.progress = Progress(
            TextColumn(f"[bold]{sim.policy.name}[/]"),
            BarColumn(),
            TextColumn("{task.fields[sim_day]:.1f} simulated days"),
            TextColumn("{task.fields[events]:,} events"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.progress.add_task("sim", total=max(self.end, 1.0), sim_day=0.0, events=0)
        self.progress.start()
        self.next_update = 20000

    def update(self, t: float, events: int) -> None:
        self.progress.update(self.task, completed=min(t, self.end), sim_day=t / 86400, events=events)
        self.next_update = events + 20000

    def close(self) -> None:
        self.progress.stop()
