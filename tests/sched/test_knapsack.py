"""The MCKP solvers against an integer programme (HiGHS), plus the greedy's guarantees and the edge cases."""

from __future__ import annotations

import highspy
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.sched.knapsack import greedy_mckp, solve, solve_mckp

Instance = tuple[list[np.ndarray], list[np.ndarray], int]


def random_instance(rng: np.random.Generator) -> Instance:
    """1-8 classes of 1-6 items, item 0 of weight 0, weights 0-12, values in [-5, 10], capacity 0-30."""
    values, weights = [], []
    for _ in range(int(rng.integers(1, 9))):
        k = int(rng.integers(1, 7))
        w = rng.integers(0, 13, size=k)
        w[0] = 0
        values.append(np.round(rng.uniform(-5.0, 10.0, size=k), 2))
        weights.append(w)
    return values, weights, int(rng.integers(0, 31))


def ip_optimum(values: list[np.ndarray], weights: list[np.ndarray], capacity: int) -> float:
    """The same MCKP as a 0-1 integer programme: sum_k x_ik = 1 per class, sum w x <= C, maximise sum v x."""
    v = np.concatenate(values)
    w = np.concatenate(weights).astype(np.float64)
    n = v.size
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 1e-9)
    cols = np.arange(n, dtype=np.int32)
    h.addVars(n, np.zeros(n), np.ones(n))
    h.changeColsCost(n, cols, v)
    h.changeColsIntegrality(n, cols, np.array([highspy.HighsVarType.kInteger] * n))
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    sizes = [x.size for x in values]
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int32)
    m = len(values)
    h.addRows(m, np.ones(m), np.ones(m), n, starts, cols, np.ones(n))  # one item per class
    h.addRows(1, np.array([-highspy.kHighsInf]), np.array([float(capacity)]), n, np.array([0], np.int32), cols, w)
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return float(h.getInfo().objective_function_value)


def check_choice(values: list[np.ndarray], weights: list[np.ndarray], capacity: int, value: float, choice: list[int]):
    """The choice has one valid item per class, fits the capacity and is worth the value returned."""
    assert len(choice) == len(values)
    assert all(0 <= k < len(v) for k, v in zip(choice, values, strict=True))
    assert sum(int(weights[i][k]) for i, k in enumerate(choice)) <= capacity
    assert value == pytest.approx(sum(float(values[i][k]) for i, k in enumerate(choice)), abs=1e-9)


def test_dp_matches_integer_programme_on_random_instances():
    rng = np.random.default_rng(2024)
    for _ in range(250):
        values, weights, capacity = random_instance(rng)
        value, choice = solve_mckp(values, weights, capacity)
        check_choice(values, weights, capacity, value, choice)
        assert value == pytest.approx(ip_optimum(values, weights, capacity), abs=1e-6)


def test_greedy_is_feasible_and_never_beats_the_dp():
    rng = np.random.default_rng(7)
    for _ in range(250):
        values, weights, capacity = random_instance(rng)
        best, _ = solve_mckp(values, weights, capacity)
        value, choice = greedy_mckp(values, weights, capacity)
        check_choice(values, weights, capacity, value, choice)
        assert value <= best + 1e-9


@settings(max_examples=150, deadline=None)
@given(
    marginals=st.lists(
        st.lists(st.floats(0.0, 10.0, allow_nan=False).map(lambda x: round(x, 3)), min_size=0, max_size=7),
        min_size=1,
        max_size=8,
    ),
    gpus_per_worker=st.integers(1, 4),
    capacity=st.integers(0, 60),
)
def test_greedy_is_optimal_on_diminishing_returns_with_equal_worker_size(marginals, gpus_per_worker, capacity):
    # item k = k extra workers of g GPUs each; value = sum of the k largest marginals (concave in k)
    values = [np.concatenate(([0.0], np.cumsum(sorted(m, reverse=True)))) for m in marginals]
    weights = [gpus_per_worker * np.arange(v.size) for v in values]
    best, _ = solve_mckp(values, weights, capacity)
    value, choice = greedy_mckp(values, weights, capacity)
    check_choice(values, weights, capacity, value, choice)
    assert value == pytest.approx(best, abs=1e-9)


def test_greedy_keeps_collinear_steps_that_float_sums_put_one_ulp_low():
    # found by hypothesis in CI: cumsum gives 1.781, 2.781, 3.7809999999999997, so the middle item tested a hair
    # below the hull; dropping it made one 2-worker step the greedy could not fit in the last unit
    values = [np.array([0.0, 1.0]), np.concatenate(([0.0], np.cumsum([1.781, 1.0, 1.0])))]
    weights = [np.arange(2), np.arange(4)]
    best, _ = solve_mckp(values, weights, 3)
    value, choice = greedy_mckp(values, weights, 3)
    check_choice(values, weights, 3, value, choice)
    assert best == pytest.approx(3.781)
    assert value == pytest.approx(best, abs=1e-9)


def test_ties_prefer_smaller_items_for_earlier_classes():
    # two classes, capacity for one extra item worth 1 in either: the first class keeps item 0
    values = [np.array([0.0, 1.0]), np.array([0.0, 1.0])]
    weights = [np.array([0, 1]), np.array([0, 1])]
    assert solve_mckp(values, weights, 1) == (1.0, [0, 1])
    # an extra item worth nothing is not bought
    assert solve_mckp([np.array([2.0, 2.0, 2.0])], [np.array([0, 1, 2])], 5) == (2.0, [0])


def test_negative_values_and_items_heavier_than_capacity():
    values = [np.array([-3.0, -1.0, 50.0]), np.array([1.0, 4.0])]
    weights = [np.array([0, 2, 10]), np.array([0, 3])]
    assert solve_mckp(values, weights, 5) == (3.0, [1, 1])
    assert greedy_mckp(values, weights, 5) == (3.0, [1, 1])


def test_capacity_zero_takes_the_weightless_items():
    values = [np.array([-1.0, 5.0]), np.array([2.0, 7.0, 9.0])]
    weights = [np.array([0, 1]), np.array([0, 2, 0])]
    assert solve_mckp(values, weights, 0) == (8.0, [0, 2])
    assert greedy_mckp(values, weights, 0) == (8.0, [0, 2])


def test_one_class_no_classes_and_all_zero_values():
    assert solve_mckp([np.array([0.0, 3.0, 5.0])], [np.array([0, 2, 4])], 3) == (3.0, [1])
    for solver in (solve_mckp, greedy_mckp, solve):
        assert solver([], [], 10) == (0.0, [])
        zeros = [np.zeros(4)] * 3
        assert solver(zeros, [np.arange(4)] * 3, 6) == (0.0, [0, 0, 0])


def test_class_without_weight_zero_item_is_fine_when_feasible():
    values = [np.array([1.0, 2.0]), np.array([0.0, 3.0])]
    weights = [np.array([2, 3]), np.array([0, 1])]
    assert solve_mckp(values, weights, 4) == (5.0, [1, 1])
    assert solve_mckp(values, weights, 2) == (1.0, [0, 0])


@pytest.mark.parametrize("solver", [solve_mckp, greedy_mckp, solve])
def test_infeasible_instance_raises(solver):
    with pytest.raises(ValueError, match="infeasible"):
        solver([np.array([1.0]), np.array([1.0, 2.0])], [np.array([3]), np.array([2, 4])], 4)
    with pytest.raises(ValueError, match="no items"):
        solver([np.array([])], [np.array([], dtype=int)], 4)
    with pytest.raises(ValueError, match="non-negative integers"):
        solver([np.array([1.0])], [np.array([-1])], 4)
    with pytest.raises(ValueError, match="capacity"):
        solver([np.array([1.0])], [np.array([0])], -1)


def test_solve_switches_to_greedy_above_max_cells():
    # the greedy buys the better ratio (2 per GPU) first and then cannot afford the 10-GPU item worth 15
    values = [np.array([0.0, 2.0]), np.array([0.0, 15.0])]
    weights = [np.array([0, 1]), np.array([0, 10])]
    assert greedy_mckp(values, weights, 10) == (2.0, [1, 0])
    assert solve_mckp(values, weights, 10) == (15.0, [0, 1])
    assert solve(values, weights, 10) == (15.0, [0, 1])  # 3 items x 10 = 30 cells
    assert solve(values, weights, 10, max_cells=29) == (2.0, [1, 0])
