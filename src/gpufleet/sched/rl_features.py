"""The learned policy's view of one decision: a scale-free vector that means the same on 4 nodes or 4,000.

Per candidate slot (:data:`gpufleet.sched.candidates.SLOTS`): whether it fits, its node count, the job's
predicted speed and contention ratio there, the speed it would take from jobs sharing its links (per GPU
of the job), the NIC load on its nodes and how full its nodes would be. Then the job (its communication
sensitivity and intensity on two nodes, its GPU share of a node, its remaining work, how soon enough GPUs
for it free up and how many free up within a quarter of its length, in units of its own size) and the
cluster (busy share, share of whole free nodes, queued jobs per node and queued GPU demand, mean NIC load). Nothing
depends on the number of nodes, so a policy trained on the 4-node testbed runs on a 64-node cluster.

With ``arrivals`` the vector goes on with what arrivals change (:data:`ARRIVAL_FEATURES`): how long the job has
waited (against its remaining time, and in hours), the share of its work done (a preempted job's), and how many
jobs arrived per node within its remaining time before now. Models trained without them read the first
:data:`OBS_SIZE` values, so the old observation is a prefix of the new one.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from gpufleet.sched.candidates import N_SLOTS, SLOTS

SLOT_FEATURES = 7
JOB_FEATURES = 6
CLUSTER_FEATURES = 5
OBS_SIZE = N_SLOTS * SLOT_FEATURES + JOB_FEATURES + CLUSTER_FEATURES
ARRIVAL_FEATURES = 4
#: The observation with the arrival features (the ``rl`` placement trained on arrivals reads it).
ARRIVAL_OBS_SIZE = OBS_SIZE + ARRIVAL_FEATURES
#: The action that leaves the job waiting; 0 .. N_SLOTS-1 choose a slot.
WAIT = N_SLOTS
#: The action that hands the decision to the contention heuristic (the paper's RL-hybrid, made explicit: the
#: policy learns when to deviate from the heuristic rather than relearning it).
HEURISTIC = N_SLOTS + 1
N_ACTIONS = N_SLOTS + 2


def observe(sim: Any, j: int, p: int, part: Any, cands: list, scores: list, arrivals: bool = False) -> np.ndarray:
    """The observation for placing job ``j`` on partition ``p`` given its candidates and their scores (with
    ``arrivals``, followed by :func:`arrival_features`)."""
    obs = np.zeros(ARRIVAL_OBS_SIZE if arrivals else OBS_SIZE, dtype=np.float32)
    net = sim.network
    g = sim.gpus[j]
    gpn = part.gpus_per_node
    for i, (cand, sc) in enumerate(zip(cands, scores, strict=True)):
        if cand is None:
            continue
        base = i * SLOT_FEATURES
        n = len(cand)
        speed, ratio, harm = sc
        loads = [net.nic_load(p, node) for node, _ in cand] if net is not None and n > 1 else [0.0]
        fill = sum((part.gpus_per_node - part.free[node] + c) for node, c in cand) / (n * gpn)
        obs[base : base + SLOT_FEATURES] = (1.0, n / 8.0, speed, ratio, harm / g, min(max(loads), 4.0) / 4.0, fill)
    base = N_SLOTS * SLOT_FEATURES
    prof = net.comm.profile[j] if net is not None else None
    if prof is not None and g > 1:
        m = net.model
        sc = float(net.comm.scale[j])
        s2 = m.sensitivity(prof, g, 2, net.nic_gbps(p)) * sc
        p2 = m.intensity(prof, g, 2, net.nic_gbps(p)) * sc
    else:
        s2 = p2 = 0.0
    rem_h = sim.remaining[j] / 3600.0
    # how soon enough GPUs for this job free up, against its own length, and how many free up within a quarter
    # of it, in units of its own size: both mean the same on 4 nodes or 4,000 (a cluster-wide minimum would not)
    running = sim.running_jobs()
    horizon = max(sim.remaining[j], 1.0)
    soon, freeing = 1.0, 0.0
    if running:
        left = np.asarray([sim.expected_finish[k] for k in running]) - sim.now
        size = np.asarray([sim.gpus[k] for k in running], dtype=np.float64)
        order = np.argsort(left, kind="stable")
        enough = np.searchsorted(np.cumsum(size[order]), g - part.total_free)
        if enough < len(order):
            soon = float(np.clip(left[order[enough]] / horizon, 0.0, 4.0)) / 4.0
        freeing = min(float(size[left <= 0.25 * horizon].sum()) / g, 4.0) / 4.0
    obs[base : base + JOB_FEATURES] = (
        min(s2, 2.0),
        min(p2, 4.0) / 4.0,
        g / gpn,
        math.log1p(rem_h) / 3.0,
        soon,
        freeing,
    )
    base += JOB_FEATURES
    total = sim.total_gpus
    whole = sum(len(q.buckets[q.gpus_per_node]) for q in sim.parts)
    nodes = sum(q.nodes for q in sim.parts)
    mean_load = (
        sum(net.load[i] for i, up in enumerate(net.uplink) if not up) / max(nodes, 1) if net is not None else 0.0
    )
    obs[base : base + CLUSTER_FEATURES] = (
        sim.busy / total,
        whole / nodes,
        math.log1p(sim.n_waiting / nodes) / 4.0,
        min(sim.waiting_gpus / total, 4.0) / 4.0,
        min(mean_load, 4.0) / 4.0,
    )
    if arrivals:
        obs[OBS_SIZE:] = arrival_features(sim, j, nodes)
    return obs


def arrival_features(sim: Any, j: int, nodes: int) -> tuple[float, float, float, float]:
    """What arrivals change for job ``j``: its wait so far over its remaining time and in hours (log-scaled),
    the share of its work done (preemption leaves it part-way), and the jobs that arrived within its remaining
    time before now, per node (log-scaled). Each means the same on 4 nodes or 4,000."""
    horizon = max(float(sim.remaining[j]), 1.0)
    waited = max(sim.now - sim.submit[j] - sim.held_s[j], 0.0)
    done = 1.0 - float(sim.remaining[j]) / max(float(sim.duration[j]), 1e-9)
    submit = sim.submit  # in submit order (the workload's)
    recent = bisect.bisect_right(submit, sim.now) - bisect.bisect_left(submit, sim.now - horizon)
    return (
        min(math.log1p(waited / horizon) / 3.0, 1.0),
        min(math.log1p(waited / 3600.0) / 3.0, 1.0),
        min(max(done, 0.0), 1.0),
        min(math.log1p(recent / max(nodes, 1)) / 4.0, 1.0),
    )


def action_mask(cands: list, can_wait: bool) -> np.ndarray:
    """Which actions are feasible: the slots that fit; waiting only for a job that no single node fits now
    (waiting is for a consolidated placement later) and only while something runs (an event will come)."""
    mask = np.zeros(N_ACTIONS, dtype=bool)
    for i, c in enumerate(cands):
        mask[i] = c is not None
    one_node = any(c is not None for (n, _), c in zip(SLOTS, cands, strict=False) if n == 1)
    mask[WAIT] = can_wait and not one_node
    mask[HEURISTIC] = mask[:N_SLOTS].any()
    return mask


def slot_names() -> list[str]:
    """Human names of the actions, for logs and reports."""
    return [f"{n}-node {s}" if n else "fewest-nodes" for n, s in SLOTS] + ["wait", "heuristic"]
