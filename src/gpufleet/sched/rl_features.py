"""The learned policy's view of one decision: a scale-free vector that means the same on 4 nodes or 4,000.

Per candidate slot (:data:`gpufleet.sched.candidates.SLOTS`): whether it fits, its node count, the job's
predicted speed and contention ratio there, the speed it would take from jobs sharing its links (per GPU
of the job), the NIC load on its nodes and how full its nodes would be. Then the job (its communication
sensitivity and intensity on two nodes, its GPU share of a node, its remaining work, how soon the first
running job ends and how many GPUs free up within a quarter of its own length) and the cluster
(busy share, share of whole free nodes, queue length and queued GPU demand, mean NIC load). Nothing
depends on the number of nodes, so a policy trained on the 4-node testbed runs on a 64-node cluster.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpufleet.sched.candidates import N_SLOTS, SLOTS

SLOT_FEATURES = 7
JOB_FEATURES = 6
CLUSTER_FEATURES = 5
OBS_SIZE = N_SLOTS * SLOT_FEATURES + JOB_FEATURES + CLUSTER_FEATURES
#: The action that leaves the job waiting; 0 .. N_SLOTS-1 choose a slot.
WAIT = N_SLOTS
#: The action that hands the decision to the contention heuristic (the paper's RL-hybrid, made explicit: the
#: policy learns when to deviate from the heuristic rather than relearning it).
HEURISTIC = N_SLOTS + 1
N_ACTIONS = N_SLOTS + 2


def observe(sim: Any, j: int, p: int, part: Any, cands: list, scores: list) -> np.ndarray:
    """The observation for placing job ``j`` on partition ``p`` given its candidates and their scores."""
    obs = np.zeros(OBS_SIZE, dtype=np.float32)
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
        obs[base:base + SLOT_FEATURES] = (1.0, n / 8.0, speed, ratio, harm / g, min(max(loads), 4.0) / 4.0, fill)
    base = N_SLOTS * SLOT_FEATURES
    prof = net.comm.profile[j] if net is not None else None
    if prof is not None and g > 1:
        m = net.model
        sc = float(net.comm.scale[j])
        s2 = m.sensitivity(prof, g, 2) * sc
        p2 = m.intensity(prof, g, 2) * sc
    else:
        s2 = p2 = 0.0
    rem_h = sim.remaining[j] / 3600.0
    # how soon GPUs free up, against this job's own length: tells waiting for a better node set from stalling
    running = sim.running_jobs()
    if running:
        left = np.asarray([sim.expected_finish[k] for k in running]) - sim.now
        size = np.asarray([sim.gpus[k] for k in running], dtype=np.float64)
        horizon = max(sim.remaining[j], 1.0)
        soon = float(np.clip(left.min() / horizon, 0.0, 4.0)) / 4.0
        freeing = float(size[left <= 0.25 * horizon].sum()) / sim.total_gpus
    else:
        soon, freeing = 0.0, 0.0
    obs[base:base + JOB_FEATURES] = (min(s2, 2.0), min(p2, 4.0) / 4.0, g / gpn, math.log1p(rem_h) / 3.0, soon,
                                     freeing)
    base += JOB_FEATURES
    total = sim.total_gpus
    whole = sum(len(q.buckets[q.gpus_per_node]) for q in sim.parts)
    nodes = sum(q.nodes for q in sim.parts)
    mean_load = (sum(net.load[: len(net.load)]) / max(nodes, 1)) if net is not None else 0.0
    obs[base:base + CLUSTER_FEATURES] = (sim.busy / total, whole / nodes, math.log1p(sim.n_waiting) / 8.0,
                                         min(sim.waiting_gpus / total, 4.0) / 4.0, min(mean_load, 4.0) / 4.0)
    return obs


def action_mask(cands: list, can_wait: bool) -> np.ndarray:
    """Which actions are feasible: the slots that fit, and waiting when something will happen anyway."""
    mask = np.zeros(N_ACTIONS, dtype=bool)
    for i, c in enumerate(cands):
        mask[i] = c is not None
    mask[WAIT] = can_wait
    mask[HEURISTIC] = mask[:N_SLOTS].any()
    return mask


def slot_names() -> list[str]:
    """Human names of the actions, for logs and reports."""
    return [f"{n}-node {s}" if n else "fewest-nodes" for n, s in SLOTS] + ["wait", "heuristic"]
