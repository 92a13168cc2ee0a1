"""Meta-IO: TaskStore batches, the per-epoch step plan and the prefetching MetaLoader."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.errors import MetaError
from gpufleet.meta.loader import MetaLoader, TaskStore, plan_steps
from gpufleet.meta.prepare import PrepareConfig, prepare_movielens_100k, prepare_tasks
from gpufleet.meta.schema import TRAIN_FILE

# MovieLens-100k's 943 users: 20 % cold-start, 15 % validation (prepare's defaults), the rest training
COLD_TASKS, VAL_TASKS = round(0.2 * 943), round(0.15 * 943)
TRAIN_TASKS = 943 - COLD_TASKS - VAL_TASKS


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ml100k")
    prepare_movielens_100k(out)
    return out


@pytest.fixture(scope="module")
def store(folder: Path) -> TaskStore:
    return TaskStore.open(folder)


@pytest.fixture(scope="module")
def records(folder: Path) -> dict[str, list]:
    return pq.read_table(folder / TRAIN_FILE).to_pydict()


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "meta-prefetch"]


# ---------------------------------------------------------------------------------------------- TaskStore


def test_store_shapes(store: TaskStore, records: dict[str, list]) -> None:
    assert store.num_tasks == len(records["task_id"]) == TRAIN_TASKS
    assert (store.support_sizes == 10).all()
    assert store.query_sizes.tolist() == [len(x) for x in records["query_label"]]
    assert (store.sizes == store.support_sizes + store.query_sizes).all()
    assert store.meta.num_sparse == 6 and store.meta.num_dense == 21
    assert store.task_keys == records["task_key"]


def _check_batch(store: TaskStore, records: dict[str, list], tasks: np.ndarray) -> None:
    batch = store.batch(tasks)
    f, d = store.meta.num_sparse, store.meta.num_dense
    assert batch.task_ids.tolist() == [records["task_id"][t] for t in tasks]
    assert np.array_equal(batch.unique_ids, np.unique(batch.unique_ids))
    for prefix, name in (("sup", "support"), ("qry", "query")):
        idx, dense = getattr(batch, f"{prefix}_idx"), getattr(batch, f"{prefix}_dense")
        label, mask = getattr(batch, f"{prefix}_label"), getattr(batch, f"{prefix}_mask")
        width = max((len(records[f"{name}_label"][t]) for t in tasks), default=0)
        assert idx.shape == (len(tasks), width, f) and dense.shape == (len(tasks), width, d)
        for row, t in enumerate(tasks):
            n = len(records[f"{name}_label"][t])
            assert mask[row].tolist() == [True] * n + [False] * (width - n)
            ids = np.asarray(records[f"{name}_sparse"][t]).reshape(n, f)
            assert np.array_equal(batch.unique_ids[idx[row, :n]], ids)  # dedup round-trips
            assert np.allclose(dense[row, :n], np.asarray(records[f"{name}_dense"][t]).reshape(n, d))
            assert label[row, :n].tolist() == records[f"{name}_label"][t]
        assert (idx[~mask] == 0).all() and (dense[~mask] == 0).all() and (label[~mask] == 0).all()
    assert batch.num_samples == sum(len(records["support_label"][t]) + len(records["query_label"][t]) for t in tasks)


def test_batch_round_trip(store: TaskStore, records: dict[str, list]) -> None:
    _check_batch(store, records, np.array([5, 0, 600, 33]))
    _check_batch(store, records, np.arange(store.num_tasks))


@settings(max_examples=30, deadline=None)
@given(tasks=st.lists(st.integers(0, TRAIN_TASKS - 1), min_size=1, max_size=12))
def test_batch_round_trip_any_tasks(store: TaskStore, records: dict[str, list], tasks: list[int]) -> None:
    _check_batch(store, records, np.array(tasks))


def test_batch_dedups_across_support_and_query(store: TaskStore) -> None:
    batch = store.batch(np.arange(16))
    all_ids = np.concatenate(
        [
            batch.unique_ids[batch.sup_idx[batch.sup_mask]].ravel(),
            batch.unique_ids[batch.qry_idx[batch.qry_mask]].ravel(),
        ]
    )
    assert batch.unique_ids.size == np.unique(all_ids).size < all_ids.size


def test_empty_batch(store: TaskStore) -> None:
    batch = store.batch([])
    assert batch.num_tasks == 0 and batch.unique_ids.size == 0 and batch.sup_idx.shape == (0, 0, 6)


def test_store_without_dense_features(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    frame = pl.DataFrame(
        {"user": rng.integers(0, 30, 2000).astype(str), "item": rng.integers(0, 300, 2000).astype(str)}
    )
    prepare_tasks(frame.with_columns(pl.int_range(0, 2000).alias("time")), PrepareConfig(), tmp_path)
    store = TaskStore.open(tmp_path)
    batch = store.batch(np.arange(store.num_tasks))
    assert batch.sup_dense.shape == (store.num_tasks, 20, 0)  # 10 positives + 10 negatives
    assert np.array_equal(batch.sup_label.sum(axis=1), np.full(store.num_tasks, 10.0))


def test_store_errors(tmp_path: Path, folder: Path) -> None:
    with pytest.raises(MetaError, match=r"meta\.json: no such file"):
        TaskStore.open(tmp_path)
    with pytest.raises(MetaError, match="unknown split 'test'"):
        TaskStore.open(folder, split="test")
    assert TaskStore.open(folder, split="cold").num_tasks == COLD_TASKS
    assert TaskStore.open(folder, split="val").num_tasks == VAL_TASKS


# ---------------------------------------------------------------------------------------------- plan_steps


def test_plan_covers_each_task_at_most_once(store: TaskStore) -> None:
    steps = plan_steps(store.sizes, 32, 4, seed=0, epoch=0)
    assert len(steps) == TRAIN_TASKS // 32
    flat = np.concatenate([t for step in steps for t in step])
    assert flat.size == len(steps) * 32 == np.unique(flat).size
    full = plan_steps(store.sizes, 32, 4, seed=0, epoch=0, drop_last=False)
    assert len(full) == len(steps) + 1
    assert np.array_equal(np.sort(np.concatenate([t for s in full for t in s])), np.arange(TRAIN_TASKS))


def test_plan_same_global_steps_for_any_world(store: TaskStore) -> None:
    plans = {w: plan_steps(store.sizes, 16, w, seed=7, epoch=3) for w in (1, 2, 4)}
    for w, steps in plans.items():
        assert len(steps) == len(plans[1]) and all(len(step) == w for step in steps)
        for step, ref in zip(steps, plans[1], strict=True):
            assert np.array_equal(np.sort(np.concatenate(step)), np.sort(ref[0]))
            assert [len(t) for t in step] == [16 // w] * w


def test_plan_depends_on_seed_and_epoch(store: TaskStore) -> None:
    a = plan_steps(store.sizes, 16, 2, seed=1, epoch=0)
    assert all(
        np.array_equal(x, y)
        for s, t in zip(a, plan_steps(store.sizes, 16, 2, 1, 0), strict=True)
        for x, y in zip(s, t, strict=True)
    )
    assert not np.array_equal(np.concatenate(a[0]), np.concatenate(plan_steps(store.sizes, 16, 2, 1, 1)[0]))


def test_plan_balances_samples_better_than_a_random_split() -> None:
    sizes = np.random.default_rng(0).integers(15, 400, size=4096)
    steps = plan_steps(sizes, 32, 4, seed=0, epoch=0)
    planned = np.mean([np.ptp([sizes[t].sum() for t in step]) for step in steps])
    rng = np.random.default_rng(1)
    naive = np.mean(
        [np.ptp([sizes[c].sum() for c in np.split(rng.permutation(np.concatenate(step)), 4)]) for step in steps]
    )
    assert planned < 0.25 * naive


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 500), min_size=0, max_size=120),
    per_step=st.integers(1, 20),
    world=st.integers(1, 8),
    drop_last=st.booleans(),
)
def test_plan_invariants(sizes: list[int], per_step: int, world: int, drop_last: bool) -> None:
    steps = plan_steps(np.array(sizes, dtype=np.int64), per_step, world, seed=0, epoch=0, drop_last=drop_last)
    expected = len(sizes) // per_step if drop_last else -(-len(sizes) // per_step)
    assert len(steps) == expected and all(len(step) == world for step in steps)
    flat = np.concatenate([t for step in steps for t in step]) if steps else np.array([], np.int64)
    assert np.unique(flat).size == flat.size  # no task twice in an epoch
    for step in steps:
        counts = [len(t) for t in step]
        assert max(counts) - min(counts) <= 1


def test_plan_rejects_bad_arguments() -> None:
    with pytest.raises(MetaError, match="tasks_per_step"):
        plan_steps([1, 2], 0, 1, 0, 0)


# ---------------------------------------------------------------------------------------------- MetaLoader


def test_loader_yields_this_ranks_tasks(store: TaskStore) -> None:
    world = 2
    loaders = [MetaLoader(store, 16, rank, world, seed=5) for rank in range(world)]
    plan = plan_steps(store.sizes, 16, world, seed=5, epoch=0)
    assert len(loaders[0]) == len(plan) == TRAIN_TASKS // 16
    for rank, loader in enumerate(loaders):
        got = [b.task_ids for b in loader]
        assert len(got) == len(plan)
        assert all(np.array_equal(g, store.task_ids[step[rank]]) for g, step in zip(got, plan, strict=True))


def test_loader_tells_each_rank_every_ranks_ids(store: TaskStore) -> None:
    world = 3
    per_rank = [list(MetaLoader(store, 12, rank, world, seed=2, peer_ids=True)) for rank in range(world)]
    assert (
        MetaLoader(store, 12, 0, world, seed=2).plan()
        and next(iter(MetaLoader(store, 12, 0, 1, seed=2))).peer_ids is None
    )
    for step in range(len(per_rank[0])):
        own = [per_rank[r][step].unique_ids for r in range(world)]
        for r in range(world):
            peers = per_rank[r][step].peer_ids
            assert peers is not None and all(np.array_equal(a, b) for a, b in zip(peers, own, strict=True))


def test_loader_set_epoch_and_sync_path(store: TaskStore) -> None:
    loader = MetaLoader(store, 32, 0, 1, seed=0, prefetch=0)
    first = [b.task_ids for b in loader]
    loader.set_epoch(1)
    second = [b.task_ids for b in MetaLoader(store, 32, 0, 1, seed=0, epoch=1, prefetch=3)]
    assert not np.array_equal(first[0], second[0])
    assert all(np.array_equal(a, b) for a, b in zip([b.task_ids for b in loader], second, strict=True))


def test_loader_resumes_mid_epoch(store: TaskStore) -> None:
    loader = MetaLoader(store, 16, 1, 2, seed=3, epoch=2)
    full = [b.task_ids for b in loader]
    tail = [b.task_ids for b in loader.iter_from(5)]
    assert len(tail) == len(full) - 5
    assert all(np.array_equal(a, b) for a, b in zip(full[5:], tail, strict=True))


def test_loader_propagates_worker_errors(store: TaskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real = store.batch

    def failing(tasks: np.ndarray) -> object:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk on fire")
        return real(tasks)

    monkeypatch.setattr(store, "batch", failing)
    seen = 0
    with pytest.raises(RuntimeError, match="disk on fire"):
        for _ in MetaLoader(store, 16, 0, 1, seed=0):
            seen += 1
    assert seen == 2
    assert not _prefetch_threads()


def test_loader_stops_on_early_break(store: TaskStore) -> None:
    for _ in MetaLoader(store, 8, 0, 1, seed=0, prefetch=1):
        break
    gc.collect()
    assert not _prefetch_threads()
    iterator = iter(MetaLoader(store, 8, 0, 1, seed=0, prefetch=2))
    next(iterator)
    iterator.close()
    assert not _prefetch_threads()


def test_loader_errors(store: TaskStore) -> None:
    with pytest.raises(MetaError, match="rank 2 is outside"):
        MetaLoader(store, 8, 2, 2, seed=0)
    too_big = MetaLoader(store, 1000, 0, 1, seed=0)
    assert len(too_big) == 0 and list(too_big) == []
