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
