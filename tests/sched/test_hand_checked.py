"""Exact JCTs on tiny traces, worked out by hand (comments give the schedule)."""

from __future__ import annotations

import pytest
from helpers import finish_times, simulate

from gpufleet.errors import ConfigError
from gpufleet.sched.policy import available_policies, make_policy
from gpufleet.sim.config import SimConfig

# one node of 2 GPUs; (submit, duration, gpus)
TRACE = [(0, 10, 2), (1, 5, 2), (2, 2, 2), (3, 1, 1)]


def test_fifo_runs_in_arrival_order():
    # j0 0-10, j1 10-15, j2 15-17, j3 17-18 (j3 would fit beside nobody: FIFO never backfills)
    r = simulate(TRACE, "fifo")
    assert finish_times(r) == [10, 15, 17, 18]
    assert r.jobs.sort("job_id")["jct_s"].to_list() == [10, 14, 15, 15]
    assert r.summary["preemptions"] == 0


def test_fifo_head_of_line_blocks_smaller_jobs():
    # 2 GPUs: j0 holds 1 GPU until 10; j1 needs 2 and blocks j2 (1 GPU) although a GPU is free
    r = simulate([(0, 10, 1), (1, 5, 2), (2, 1, 1)], "fifo")
    assert finish_times(r) == [10, 15, 16]


def test_sjf_orders_by_duration_and_backfills():
    # j0 0-10; at 10 the queue is j3(1s,1 GPU) j2(2s) j1(5s): j3 10-11, j2 waits for 2 GPUs: 11-13, j1 13-18
    r = simulate(TRACE, "sjf")
    assert finish_times(r) == [10, 18, 13, 11]


def test_srtf_preempts_for_shorter_remaining_work():
    # t=1 j1 (5) preempts j0 (9 left); t=2 j2 (2) preempts j1 (4 left); t=3 j3 (1) waits: j2 has 1 left
    # and is not worse; t=4 j2 done, j3 4-5 on one GPU; t=5 j1 5-9; j0 9-18
    r = simulate(TRACE, "srtf")
    assert finish_times(r) == [18, 9, 4, 5]
    assert r.summary["preemptions"] == 2


def test_srtf_looks_past_a_slowed_job_for_a_victim_with_more_work():
    # 2 nodes x 4 GPUs, a job spread over more nodes than it needs runs at half speed. j0 and j1 (3 GPUs,
    # 40 s) take 3 GPUs of each node; j2 (2 GPUs, 25 s) at t=1 must spread: speed 0.5, done at 51. At t=2 j3
    # (2 GPUs, 30 s) arrives. j2 tops the victim heap (latest expected finish, 49 s of time left) but has only
    # 24.5 s of work left, less than j3's 30: it is passed over, not the end of the search. j0 (38 s of work
    # left) gives way: j3 runs 2-32 on node 0, j0 resumes 32-70, j2 ends at 51, j1 at 40.
    cfg = SimConfig(checkpoint_interval_s=0.0, restart_s=0.0, debug=True, placement_penalty=0.5)
    r = simulate([(0, 40, 3), (0, 40, 3), (1, 25, 2), (2, 30, 2)], "srtf", nodes=2, gpus_per_node=4, config=cfg)
    assert finish_times(r) == [70, 40, 51, 32]
    assert r.summary["preemptions"] == 1


def test_las_shares_by_attained_service_with_quantum():
    # quantum 2 GPU-s on 2-GPU jobs = 1 s of lead. t=1 j1 preempts j0 (2 GPU-s attained); t=2 j2 preempts
    # j1; t=3 j3 (0) preempts j2 and runs alone 3-4; then j0 4-5, j1 5-6, j2 6-7 (its last second: done),
    # j0 7-8, j1 8-9 ... until j1 (5 s) ends at 13 and j0 runs alone to 18.
    r = simulate(TRACE, "las", quantum_gpu_s=2.0)
    assert finish_times(r) == [18, 13, 7, 4]


def test_tiresias_is_fifo_with_backfill_below_the_first_threshold():
    r = simulate(TRACE, "tiresias")  # default threshold 3600 GPU-s: every job stays in queue 0
    assert finish_times(r) == [10, 15, 17, 18]
    r = simulate([(0, 10, 1), (1, 5, 2), (2, 1, 1)], "tiresias")
    assert finish_times(r) == [10, 15, 3]  # j2 backfills beside j0, unlike FIFO


def test_tiresias_demotes_after_threshold_and_preempts_lower_queue():
    # threshold 4 GPU-s: j0 (2 GPUs) is demoted at t=2 and j1 (queue 0) preempts it at t=3.
    # j1 is demoted at t=5 (4 GPU-s), but it arrived later than j0 so j0 (same queue 1, earlier) preempts
    # it back: j0 resumes 5-12 (7 s left), then j1 12-15 (3 s left).
    r = simulate([(0, 10, 2), (3, 5, 2)], "tiresias", thresholds="4", promote_knob=0.0)
    assert finish_times(r) == [12, 15]
    assert r.summary["preemptions"] == 2


def test_tiresias_starvation_guard_promotes_a_waiting_job():
    # one GPU, threshold 2 GPU-s. j0 (10 s) is demoted at t=2 and preempted at t=3 by a stream of 1.5-s
    # jobs arriving every 1.5 s until t=60, which never leave queue 0 and keep the GPU busy until 61.5.
    stream = [(3 + 1.5 * k, 1.5, 1) for k in range(39)]
    trace = [(0, 10, 1), *stream]
    # without the guard j0 starves until the stream ends: 61.5 + 7 s left
    starved = simulate(trace, "tiresias", nodes=1, gpus_per_node=1, thresholds="2", promote_knob=0.0)
    assert finish_times(starved)[0] == pytest.approx(68.5)
    # with it, j0 is promoted after waiting as long as it has run and gets the GPU back in 2-s slices
    guarded = simulate(trace, "tiresias", nodes=1, gpus_per_node=1, thresholds="2", promote_knob=1.0)
    assert finish_times(guarded)[0] < 40
    assert guarded.summary["finished"] == len(trace)


def test_checkpoint_loss_and_restart_cost():
    # SRTF, checkpoint every 4 s of progress, restart 1 s. j0 runs 0-6 (6 done, checkpoint at 4), is
    # preempted by j1 (2 s) at 6: 2 s lost. j1 6-8. j0 restarts at 8: 1 s restore, 6 s left -> 15.
    cfg = SimConfig(checkpoint_interval_s=4.0, restart_s=1.0, debug=True)
    r = simulate([(0, 10, 2), (6, 2, 2)], "srtf", config=cfg)
    assert finish_times(r) == [15, 8]
    assert r.summary["lost_work_gpu_h"] == pytest.approx(2 * 2 / 3600)


def test_policy_registry_and_options():
    assert {"fifo", "sjf", "srtf", "las", "tiresias"} <= set(available_policies())
    with pytest.raises(ConfigError, match="Did you mean 'fifo'"):
        make_policy("fifoo")
    with pytest.raises(ConfigError, match="no option"):
        make_policy("las", quantum=3)
    with pytest.raises(ConfigError, match="increasing"):
        make_policy("tiresias", thresholds="100,50")
