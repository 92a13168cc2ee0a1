"""Properties of whole-trace runs on the real Microsoft Philly trace (82,247 jobs)."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.sched.policy import make_policy
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.partition import Partition
from gpufleet.sim.run import run_policies
from gpufleet.sim.workload import Workload
from gpufleet.spec import load_cluster
from gpufleet.traces import load_trace


@pytest.fixture(scope="module")
def philly():
    return load_trace("philly").jobs


def test_fifo_with_unlimited_gpus_gives_jct_equal_to_duration(philly):
    # enough 8-GPU nodes for every job at once: nobody waits, every job runs on its fewest nodes
    nodes = int(np.ceil(philly["num_gpus"].sum() / 8)) + 16
    r = Simulator(
        Workload.from_frame(philly), [Partition("huge", "v100", nodes, 8)], make_policy("fifo"), SimConfig()
    ).run()
    jobs = r.jobs
    assert r.summary["finished"] == philly.height == 82_247
    np.testing.assert_allclose(jobs["jct_s"].to_numpy(), jobs["duration_s"].to_numpy(), rtol=0, atol=1e-6)
    assert float(jobs["queue_s"].abs().max()) < 1e-6


def test_sjf_never_worse_than_fifo_and_utilisation_bounded(philly):
    cluster = load_cluster()
    fifo, sjf = run_policies(philly, cluster, ["fifo", "sjf"])
    assert fifo.summary["finished"] == sjf.summary["finished"] == philly.height
    assert sjf.summary["avg_jct_s"] <= fifo.summary["avg_jct_s"]
    for r in (fifo, sjf):
        assert 0.0 < r.summary["gpu_util"] <= 1.0
        assert int(r.timeline["busy_gpus"].max()) <= r.total_gpus
        # queues form on the default cluster: the regime where policies differ
        assert r.summary["avg_queue_s"] > 0


def test_one_vc_runs_alone(philly):
    jobs = load_trace("philly", vc="6214e9").jobs
    r = run_policies(jobs, load_cluster(), ["tiresias"])[0]
    assert r.summary["jobs"] == 41_226
    assert r.summary["finished"] == 41_226


@pytest.mark.parametrize("policy", ["tiresias", "srtf"])
def test_dropping_stale_heap_entries_keeps_every_result(philly, policy, monkeypatch):
    """Cleaning stale entries out of the event and victim heaps (often, at a tiny threshold) changes no job's
    start or finish against never cleaning them; and the heaps stay near their live size when it runs."""
    from gpufleet.sim import engine

    window = philly.sort("submit_s").slice(30_000, 4_000)
    cluster = load_cluster().resized(256)
    sizes: dict[int, list[int]] = {}

    def run(cap: int) -> tuple[np.ndarray, np.ndarray]:
        monkeypatch.setattr(engine, "_COMPACT_MIN", cap)
        seen = sizes.setdefault(cap, [])
        sched = engine.Simulator._schedule

        def watched(self: engine.Simulator) -> None:
            seen.append(len(self._events) + sum(len(h) for h in self._running_heap))
            sched(self)

        monkeypatch.setattr(engine.Simulator, "_schedule", watched)
        jobs = run_policies(window, cluster, [policy])[0].jobs.sort("job_id")
        monkeypatch.setattr(engine.Simulator, "_schedule", sched)
        return jobs["start_s"].to_numpy(), jobs["finish_s"].to_numpy()

    never, often = run(1 << 40), run(8)
    np.testing.assert_array_equal(never[0], often[0])
    np.testing.assert_array_equal(never[1], often[1])
    assert max(sizes[8]) < max(sizes[1 << 40]) / 4  # the clean-ups did run, and kept the heaps small
