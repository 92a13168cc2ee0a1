"""Invariants on random traces, checked on every event (debug mode) and on the results."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import jobs_frame
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.sched.policy import make_policy
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.partition import Partition
from gpufleet.sim.workload import Workload

POLICIES = ["fifo", "sjf", "srtf", "las", "tiresias"]

job = st.tuples(
    st.integers(0, 200).map(float),  # submit
    st.integers(1, 300).map(float),  # duration
    st.sampled_from([1, 1, 1, 2, 3, 4, 8, 12, 16]),  # gpus
)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(job, min_size=1, max_size=25),
    ckpt=st.sampled_from([0.0, 7.0, 50.0]),
    restart=st.sampled_from([0.0, 3.0]),
    placement=st.sampled_from(["consolidate", "spread"]),
)
def test_invariants_hold_on_random_traces(policy, rows, ckpt, restart, placement):
    opts = {"quantum_gpu_s": 20.0} if policy == "las" else {}
    if policy == "tiresias":
        opts = {"thresholds": "30,300", "promote_knob": 2.0}
    cfg = SimConfig(checkpoint_interval_s=ckpt, restart_s=restart, placement=placement, debug=True)
    sim = Simulator(
        Workload.from_frame(jobs_frame(rows)), [Partition("p", "v100", 2, 8)], make_policy(policy, **opts), cfg
    )
    r = sim.run()  # debug mode asserts GPUs <= capacity, arrivals before runs, work conservation per event
    jobs = r.jobs
    assert r.summary["finished"] == len(rows)
    # no job starts before it arrives, none finishes faster than its work allows
    assert (jobs["start_s"] >= jobs["submit_s"]).all()
    assert (jobs["finish_s"] >= jobs["submit_s"] + jobs["duration_s"] - 1e-6).all()
    assert (jobs["queue_s"] >= -1e-6).all()
    # never more GPUs allocated than exist, at any recorded instant
    assert r.timeline["busy_gpus"].max() <= 16
    assert 0.0 <= r.summary["gpu_util"] <= 1.0 + 1e-9
    # work conservation across preemptions: GPU-time held >= work (+ lost work + restarts)
    held = (jobs["jct_s"] - jobs["queue_s"]).to_numpy()
    assert np.all(held >= jobs["duration_s"].to_numpy() - 1e-6)
    if policy in ("fifo", "sjf"):
        assert r.summary["preemptions"] == 0


def test_same_seed_same_result():
    rows = [(float(i * 7 % 50), float(10 + i * 13 % 90), [1, 2, 4, 8][i % 4]) for i in range(200)]
    a = Simulator(
        Workload.from_frame(jobs_frame(rows)), [Partition("p", "v100", 2, 8)], make_policy("tiresias"), SimConfig()
    ).run()
    b = Simulator(
        Workload.from_frame(jobs_frame(rows)), [Partition("p", "v100", 2, 8)], make_policy("tiresias"), SimConfig()
    ).run()
    assert a.jobs.equals(b.jobs)
    assert a.timeline.equals(b.timeline)


def test_placement_penalty_slows_spread_jobs():
    rows = [(0.0, 100.0, 4)]
    base = Simulator(
        Workload.from_frame(jobs_frame(rows)),
        [Partition("p", "v100", 4, 8)],
        make_policy("fifo"),
        SimConfig(placement="spread", placement_penalty=0.2),
    ).run()
    assert base.jobs["finish_s"][0] == pytest.approx(125.0)  # 4 nodes instead of 1: 0.8x speed
    packed = Simulator(
        Workload.from_frame(jobs_frame(rows)),
        [Partition("p", "v100", 4, 8)],
        make_policy("fifo"),
        SimConfig(placement="consolidate", placement_penalty=0.2),
    ).run()
    assert packed.jobs["finish_s"][0] == pytest.approx(100.0)


def test_jobs_larger_than_the_cluster_are_reported_not_run():
    rows = [(0.0, 10.0, 1), (1.0, 10.0, 64)]
    r = Simulator(
        Workload.from_frame(jobs_frame(rows)), [Partition("p", "v100", 2, 8)], make_policy("fifo"), SimConfig()
    ).run()
    assert r.summary["unschedulable"] == 1
    assert r.summary["finished"] == 1
    assert r.meta["unschedulable"] == {"needs more GPUs than its pool has": 1}


@pytest.mark.parametrize("policy", ["srtf", "tiresias"])
def test_a_job_first_started_before_time_zero_can_still_be_preempted(policy):
    """Only a restarted job is protected from preemption; a first start at a negative time is a victim like any
    other (it once stayed off the victim heap for good, since 'protected until 0' was the default)."""
    rows = [(-100.0, 1000.0, 2), (10.0, 5.0, 2)]
    opts = {"thresholds": "30,300"} if policy == "tiresias" else {}
    sim = Simulator(
        Workload.from_frame(jobs_frame(rows)),
        [Partition("p", "v100", 1, 2)],
        make_policy(policy, **opts),
        SimConfig(checkpoint_interval_s=0.0, restart_s=0.0, debug=True),
    )
    finish = sim.run().jobs["finish_s"].to_list()
    assert finish[1] == pytest.approx(15.0)  # the short job preempted the long one on arrival
    assert finish[0] == pytest.approx(905.0)
