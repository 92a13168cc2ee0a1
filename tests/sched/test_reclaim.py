"""Reclaiming loaned servers: the preemption checker by hand, the greedy against brute force and a naive twin."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.errors import ConfigError
from gpufleet.sched.reclaim import (
    RECLAIM_METHODS,
    ReclaimInstance,
    brute_force_min_preemptions,
    pick_servers,
    preempted_jobs,
)

SERVER_GPUS = 8


def random_instance(rng: np.random.Generator, loaned: int, jobs: int, training: int = 2) -> ReclaimInstance:
    """Jobs of 1-4 workers (one GPU each) spread at random over loaned and training servers of 8 GPUs.

    Servers ``0..loaned-1`` are on loan; the ``training`` servers after them are not and only hold workers.
    Each job's base demand is drawn between 1 and its workers, its lost work uniformly in [0, 1).
    """
    servers = range(loaned + training)
    free = dict.fromkeys(servers, SERVER_GPUS)
    on_server: dict[int, dict[int, int]] = {s: {} for s in servers}
    workers, min_workers, lost = {}, {}, {}
    for j in range(jobs):
        placed = 0
        for _ in range(int(rng.integers(1, 5))):
            room = [s for s in servers if free[s] > 0]
            if not room:
                break
            s = int(rng.choice(room))
            free[s] -= 1
            on_server[s][j] = on_server[s].get(j, 0) + 1
            placed += 1
        if placed:
            workers[j] = placed
            min_workers[j] = int(rng.integers(1, placed + 1))
            lost[j] = float(rng.random())
    used = {s: SERVER_GPUS - free[s] for s in servers}
    return ReclaimInstance(tuple(range(loaned)), on_server, workers, min_workers, used, lost)


def naive_cost_greedy(inst: ReclaimInstance, count: int) -> list[int]:
    """The "cost" rule written the obvious way: recompute every remaining server's key from scratch each pick."""
    picked: list[int] = []
    for _ in range(count):
        before = preempted_jobs(inst, picked)

        def key(s: int, before: set[int] = before) -> tuple[int, int, float, int]:
            new = preempted_jobs(inst, [*picked, s]) - before
            return len(new), inst.gpus_used.get(s, 0), sum(inst.lost_work.get(j, 0.0) for j in new), s

        picked.append(min((s for s in inst.servers if s not in picked), key=key))
    return picked


def small_instances(seed: int, n: int):
    """``n`` random (instance, count) pairs with at most 10 loaned servers and 8 jobs."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        loaned = int(rng.integers(1, 11))
        inst = random_instance(rng, loaned, int(rng.integers(1, 9)))
        yield inst, int(rng.integers(1, loaned + 1))


def hand_instance() -> ReclaimInstance:
    """Servers 1, 2, 3 on loan, 9 a training server.

    job 10: elastic, 4 workers (base 2): 2 on server 1, 2 on training server 9
    job 20: inelastic, 2 workers: 1 on server 2, 1 on server 3
    job 30: elastic, 3 workers (base 1): 1 on each of servers 1, 2, 3
    """
    return ReclaimInstance(
        servers=(1, 2, 3),
        on_server={1: {10: 2, 30: 1}, 2: {20: 1, 30: 1}, 3: {20: 1, 30: 1}, 9: {10: 2}},
        workers={10: 4, 20: 2, 30: 3},
        min_workers={10: 2, 20: 2, 30: 1},
        gpus_used={1: 3, 2: 2, 3: 2, 9: 2},
        lost_work={10: 5.0, 20: 1.0, 30: 2.0},
    )


def test_elastic_job_losing_only_flexible_workers_is_not_preempted():
    inst = hand_instance()
    assert preempted_jobs(inst, [1]) == set()  # job 10 keeps its 2 base workers, job 30 keeps 2 of 3


def test_inelastic_job_touched_at_all_is_preempted():
    assert preempted_jobs(hand_instance(), [2]) == {20}


def test_job_split_across_two_returned_servers_counts_once():
    inst = hand_instance()
    assert preempted_jobs(inst, [2, 3]) == {20}  # job 30 keeps its base worker on server 1
    assert preempted_jobs(inst, [1, 2, 3]) == {20, 30}


def test_preempted_jobs_rejects_servers_not_on_loan():
    with pytest.raises(ValueError, match="not loaned"):
        preempted_jobs(hand_instance(), [9])


def test_cost_greedy_recomputes_after_each_pick():
    inst = hand_instance()
    # server 1 costs 0 (two scale-ins), servers 2 and 3 cost 1 (job 20); they tie on GPUs and lost work, so
    # id 2 goes next. Job 20 is then preempted already, but job 30 now sits at its base: server 3 still costs 1
    assert pick_servers(inst, 3) == [1, 2, 3]
    assert pick_servers(inst, 3) == naive_cost_greedy(inst, 3)


def test_cost_tie_breaks_fewest_gpus_then_lost_work_then_id():
    on = {1: {1: 1}, 2: {2: 1}, 3: {3: 1}, 4: {4: 1}}
    inst = ReclaimInstance(
        servers=(4, 3, 2, 1),
        on_server=on,
        workers=dict.fromkeys(range(1, 5), 1),
        min_workers=dict.fromkeys(range(1, 5), 1),
        gpus_used={1: 4, 2: 4, 3: 4, 4: 2},
        lost_work={1: 3.0, 2: 1.0, 3: 1.0, 4: 9.0},
    )
    assert pick_servers(inst, 4) == [4, 2, 3, 1]


def test_weights_change_what_a_preemption_costs():
    # server 1 preempts one job of 4 workers; server 2 preempts two jobs of 1 worker (lost work 5 each)
    inst = ReclaimInstance(
        servers=(1, 2),
        on_server={1: {1: 4}, 2: {2: 1, 3: 1}},
        workers={1: 4, 2: 1, 3: 1},
        min_workers={1: 4, 2: 1, 3: 1},
        gpus_used={1: 4, 2: 2},
        lost_work={1: 1.0, 2: 5.0, 3: 5.0},
    )
    assert pick_servers(inst, 1, weight="jobs") == [1]
    assert pick_servers(inst, 1, weight="gpus") == [2]
    assert pick_servers(inst, 1, weight="lost") == [1]


def test_greedy_against_brute_force():
    results = []
    for inst, count in small_instances(seed=11, n=300):
        best, subset = brute_force_min_preemptions(inst, count)
        assert len(subset) == count
        assert len(preempted_jobs(inst, subset)) == best
        greedy = len(preempted_jobs(inst, pick_servers(inst, count)))
        assert greedy >= best
        results.append(greedy - best)
    gaps = np.array(results)
    rate = float(np.mean(gaps == 0))
    print(f"greedy optimal on {rate:.1%} of {gaps.size} instances, mean gap {gaps.mean():.3f}, max {gaps.max()}")
    assert rate >= 0.9
    assert gaps.mean() <= 0.1


def test_fast_greedy_equals_naive_greedy():
    for inst, count in small_instances(seed=5, n=200):
        assert pick_servers(inst, count) == naive_cost_greedy(inst, count)
    rng = np.random.default_rng(3)
    for _ in range(5):
        inst = random_instance(rng, 60, 150, training=10)
        assert pick_servers(inst, 40) == naive_cost_greedy(inst, 40)


def test_cost_beats_random_on_average():
    cost, rand = [], []
    for i, (inst, count) in enumerate(small_instances(seed=23, n=200)):
        cost.append(len(preempted_jobs(inst, pick_servers(inst, count, "cost"))))
        rand.append(len(preempted_jobs(inst, pick_servers(inst, count, "random", seed=i))))
    assert np.mean(cost) < np.mean(rand)


def test_random_is_seeded_and_distinct():
    inst = random_instance(np.random.default_rng(0), 10, 8)
    a = pick_servers(inst, 5, "random", seed=4)
    assert a == pick_servers(inst, 5, "random", seed=4)
    assert len(set(a)) == 5
    assert set(a) <= set(inst.servers)


def test_fewest_jobs_is_a_static_ranking():
    inst = hand_instance()
    # distinct jobs: server 1 -> 2, server 2 -> 2, server 3 -> 2; GPUs 3, 2, 2 -> 2, 3, 1
    assert pick_servers(inst, 3, "fewest-jobs") == [2, 3, 1]


@pytest.mark.parametrize("method", RECLAIM_METHODS)
def test_every_method_returns_count_distinct_loaned_servers(method):
    inst = random_instance(np.random.default_rng(1), 10, 8)
    for count in range(len(inst.servers) + 1):
        picked = pick_servers(inst, count, method)
        assert len(picked) == len(set(picked)) == count
        assert set(picked) <= set(inst.servers)


def test_bad_arguments():
    inst = hand_instance()
    with pytest.raises(ConfigError, match="fewest-jobs"):
        pick_servers(inst, 1, "cheapest")
    with pytest.raises(ConfigError, match="gpus"):
        pick_servers(inst, 1, weight="money")
    with pytest.raises(ValueError, match="3 are on loan"):
        pick_servers(inst, 4)
    with pytest.raises(ValueError, match="at most 20"):
        brute_force_min_preemptions(random_instance(np.random.default_rng(0), 21, 5), 1)


def test_inconsistent_instance_is_rejected():
    with pytest.raises(ValueError, match="only 1 in all"):
        ReclaimInstance((1,), {1: {5: 2}}, {5: 1}, {5: 1}, {1: 2})
    with pytest.raises(ValueError, match="missing"):
        ReclaimInstance((1,), {1: {5: 1}}, {}, {}, {1: 1})
    with pytest.raises(ValueError, match="duplicate"):
        ReclaimInstance((1, 1), {}, {}, {}, {})
