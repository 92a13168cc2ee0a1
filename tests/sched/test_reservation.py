"""EASY-style reservations: the nodes that free up first are held for a starving job, and only jobs that end
before the reservation starts may use them."""

from __future__ import annotations

import math
from types import SimpleNamespace

from gpufleet.sched.reservation import Reservation, node_free_times, reserve, respects, starving


def _sim(now=10.0):
    """Four 8-GPU nodes: node 0 free, node 1 half busy until t=50, node 2 full until 30 (two jobs: 20 and 30),
    node 3 full until 100."""
    part = SimpleNamespace(nodes=4, gpus_per_node=8, free=[8, 4, 0, 0])
    running = {1: [(1, 4)], 2: [(2, 4)], 3: [(2, 4)], 4: [(3, 8)]}
    finish = {1: 50.0, 2: 20.0, 3: 30.0, 4: 100.0}
    return SimpleNamespace(
        parts=[part], now=now, running_jobs=lambda: list(running), part_of={k: 0 for k in running},
        alloc=running, expected_finish=finish, gpus={9: 8, 10: 16, 11: 4, 12: 2},
        submit={9: 0.0, 10: 0.0, 11: 0.0, 12: 0.0}, remaining={9: 5.0, 10: 100.0, 11: 15.0, 12: 40.0})


def test_free_times_follow_each_nodes_jobs_in_finish_order():
    sim = _sim()
    assert node_free_times(sim, 0, 8) == [10.0, 50.0, 30.0, 100.0]
    assert node_free_times(sim, 0, 4) == [10.0, 10.0, 20.0, 100.0]
    assert math.isinf(node_free_times(sim, 0, 9)[3])


def test_a_two_node_job_reserves_the_two_nodes_that_empty_first():
    sim = _sim()
    res = reserve(sim, 10, 0)
    assert res == Reservation(10, 0, frozenset({0, 2}), 30.0)
    one = reserve(sim, 9, 0)
    assert one.nodes == frozenset({0}) and one.start == 10.0


def test_others_may_use_reserved_nodes_only_if_they_end_before_it_starts():
    sim = _sim()
    res = Reservation(10, 0, frozenset({0, 2}), 30.0)
    assert respects(res, sim, 11, 0, [(1, 4)], 1.0)  # off the reserved nodes
    assert respects(res, sim, 11, 0, [(0, 4)], 1.0)  # ends at 25, before 30: backfill
    assert not respects(res, sim, 11, 0, [(0, 4)], 0.5)  # slowed down it ends at 40
    assert not respects(res, sim, 12, 0, [(0, 2)], 1.0)
    assert respects(res, sim, 10, 0, [(0, 8), (2, 8)], 1.0)  # the holder itself
    assert respects(res, sim, 12, 1, [(0, 2)], 1.0)  # another partition


def test_starving_compares_the_wait_with_the_jobs_own_length():
    sim = _sim(now=10.0)
    assert starving(sim, 9, 1.0) and not starving(sim, 10, 1.0)
    assert starving(sim, 10, 0.1) and not starving(sim, 9, 0.0)
