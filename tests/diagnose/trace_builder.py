"""Build small Kineto-shaped traces by hand, so that each localiser is tested on a case whose answer is known.

A step on the training thread is: data loading, forward (matmuls), backward, then an all-reduce whose
collective runs on a gloo worker thread and ends when the last rank arrives; the main thread waits
for it inside the ``gpufleet::allreduce`` annotation, as in real gloo traces.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Fault:
    """An injected problem: extra seconds of one kind on one rank (every ``every``-th step)."""

    kind: str  # compute | data | pause (step start) | after (step end) | comm | sync | hang
    rank: int
    seconds: float = 0.02
    every: int = 1


@dataclass
class JobShape:
    """Per-step durations of the synthetic job, in seconds."""

    ranks: int = 4
    steps: int = 8
    data: float = 0.002
    matmuls: int = 6
    matmul: float = 0.004
    backward: float = 0.03
    comm: float = 0.008
    python_gap: float = 0.0005
    noise: float = 0.03  # lognormal sigma of every duration
    seed: int = 0
    faults: list[Fault] = field(default_factory=list)
    # False: the all-reduce shows no event on the training thread, so the others' wait is an untraced gap (DDP's
    # reducer on gloo); the collective still runs on gloo's thread
    traced_wait: bool = True
    # True: every matmul of the forward is its own function (aten::op0, aten::op1, ...), so a slow device's extra
    # time spreads over many small functions
    distinct_ops: bool = False


def _x(name: str, cat: str, ts: float, dur: float, tid: int, pid: int = 100, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts * 1e6, "dur": dur * 1e6, "args": args}


def build_job(shape: JobShape) -> list[dict]:
    """One trace document per rank (dicts ready for JSON)."""
    rng = np.random.default_rng(shape.seed)
    jitter = lambda s: float(s * rng.lognormal(0.0, shape.noise))  # noqa: E731
    events: list[list[dict]] = [[] for _ in range(shape.ranks)]
    clock = [1000.0] * shape.ranks
    hang_at = {f.rank: f for f in shape.faults if f.kind == "hang"}
    for step in range(shape.steps):
        arrive = [0.0] * shape.ranks
        starts = list(clock)
        stop = False
        for r in range(shape.ranks):
            t = clock[r]
            extra = {
                f.kind: f.seconds for f in shape.faults if f.rank == r and f.kind != "hang" and step % f.every == 0
            }
            ev = events[r]
            t += shape.python_gap + extra.get("pause", 0.0)
            d = jitter(shape.data) + extra.get("data", 0.0)
            ev.append(_x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", t, d, 1))
            ev.append(_x("aten::stack", "cpu_op", t + d * 0.1, d * 0.3, 1))
            t += d + shape.python_gap
            fwd0 = t
            for k in range(shape.matmuls):
                m = jitter(shape.matmul) * (1 + extra.get("compute", 0.0) / (shape.matmul * shape.matmuls))
                ev.append(_x(f"aten::op{k}" if shape.distinct_ops else "aten::mm", "cpu_op", t, m, 1))
                t += m + 0.0001
                if "sync" in extra:
                    for _ in range(3):
                        ev.append(_x("aten::isfinite", "cpu_op", t, extra["sync"] / 6, 1))
                        t += extra["sync"] / 6
                        ev.append(_x("aten::item", "cpu_op", t, 0.00002, 1))
                        ev.append(_x("aten::_local_scalar_dense", "cpu_op", t + 0.000005, 0.00001, 1))
                        t += 0.00003
            ev.append(_x("gpufleet::forward", "user_annotation", fwd0, t - fwd0, 1))
            b = jitter(shape.backward)
            ev.append(_x("gpufleet::backward", "user_annotation", t, b, 1))
            ev.append(_x("aten::mm", "cpu_op", t + 0.0001, b * 0.9, 1))
            t += b
            if r in hang_at and step == hang_at[r].every:
                stop = True
                arrive[r] = float("inf")
                clock[r] = t
                continue
            t += extra.get("comm", 0.0)  # the delay inside the comm section, before the call
            arrive[r] = t
            clock[r] = t
        done = max(arrive) + shape.comm
        for r in range(shape.ranks):
            ev = events[r]
            if arrive[r] == float("inf"):
                continue
            sec0 = arrive[r] - (
                {f.kind: f.seconds for f in shape.faults if f.rank == r and step % f.every == 0}.get("comm", 0.0)
            )
            ev.append(_x("c10d::allreduce_", "cpu_op", arrive[r] + 0.00002, 0.00008, 1))
            end = done if not stop else arrive[r] + 600.0
            ev.append(_x("gloo:all_reduce", "user_annotation", arrive[r] + 0.0001, end - arrive[r] - 0.0001, 2))
            if shape.traced_wait:
                ev.append(_x("gpufleet::allreduce", "user_annotation", sec0 + 0.00001, end - sec0 + 0.0001, 1))
            after = {f.kind: f.seconds for f in shape.faults if f.rank == r and step % f.every == 0}.get("after", 0.0)
            ev.append(_x("aten::_foreach_add_", "cpu_op", end + 0.0002, 0.0005, 1))  # the optimizer
            clock[r] = end + 0.0008 + after
            ev.append(_x(f"ProfilerStep#{step}", "user_annotation", starts[r], clock[r] - starts[r], 1))
        if stop:
            break
    return [
        {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "gloo", "rank": r, "world_size": shape.ranks},
            "traceEvents": events[r],
        }
        for r in range(shape.ranks)
    ]


def write_job(folder: Path, shape: JobShape, gz: bool = True) -> Path:
    """Write the job's traces as ``rank-{r}.json(.gz)`` into ``folder``; return it."""
    folder.mkdir(parents=True, exist_ok=True)
    for r, doc in enumerate(build_job(shape)):
        data = json.dumps(doc).encode()
        if gz:
            (folder / f"rank-{r}.json.gz").write_bytes(gzip.compress(data))
        else:
            (folder / f"rank-{r}.json").write_bytes(data)
    return folder
