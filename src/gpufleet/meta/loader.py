"""Meta-IO: prepared tasks in memory as flat NumPy arrays, a per-epoch step plan, and a prefetching loader.

``TaskStore`` reads one split into flat arrays plus per-task offsets (no per-task Python objects), and builds a
padded :class:`~gpufleet.meta.schema.TaskBatch` for any set of tasks with vectorised NumPy. ``plan_steps`` shuffles
whole tasks and cuts them into global steps that are the same for every world size, then balances each step's
tasks over ranks by sample count; ``MetaLoader`` yields one rank's batches, built ahead in a background thread.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpufleet.errors import MetaError
from gpufleet.meta.schema import COLD_FILE, COLUMNS, META_FILE, SETS, TRAIN_FILE, VAL_FILE, TaskBatch, TaskMeta

_SPLITS = {"train": TRAIN_FILE, "val": VAL_FILE, "cold": COLD_FILE}
_PREPARE_FIX = "prepare the folder first (gpufleet meta prepare)"


@dataclass(frozen=True)
class _SetArrays:
    """One sample set of every task: rows of all tasks back to back, and each task's first row and row count."""

    ids: np.ndarray  # int64 [N, F]
    dense: np.ndarray  # float32 [N, D]
    label: np.ndarray  # float32 [N]
    start: np.ndarray  # int64 [T]
    count: np.ndarray  # int64 [T]


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Values and 0-based offsets of a list column, without per-row Python objects."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    offsets = array.offsets.to_numpy().astype(np.int64)
    values = array.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    return values, offsets - offsets[0]


def _read_set(table: pa.Table, name: str, meta: TaskMeta, path: Path) -> _SetArrays:
    label, label_off = _flat(table.column(f"{name}_label"))
    count = np.diff(label_off)
    parts = {}
    for col, width, dtype in (("sparse", meta.num_sparse, np.int64), ("dense", meta.num_dense, np.float32)):
        values, offsets = _flat(table.column(f"{name}_{col}"))
        if not np.array_equal(offsets, label_off * width):
            raise MetaError(
                f"{path}: column {name}_{col} does not hold {width} values per sample of {name}_label (meta.json "
                f"says {width}); the folder is inconsistent, {_PREPARE_FIX} again"
            )
        parts[col] = values.astype(dtype, copy=False).reshape(label.shape[0], width)
    start = label_off[:-1]
    return _SetArrays(parts["sparse"], parts["dense"], label.astype(np.float32, copy=False), start, count)


class TaskStore:
    """One split of a prepared folder in memory; ``batch`` pads and deduplicates any set of its tasks."""

    def __init__(
        self,
        task_ids: np.ndarray,
        task_keys: list[str],
        support: _SetArrays,
        query: _SetArrays,
        meta: TaskMeta,
        path: Path | None = None,
    ) -> None:
        self.task_ids = task_ids
        self.task_keys = task_keys
        self.support = support
        self.query = query
        self.meta = meta
        self.path = path

    @classmethod
    def open(cls, folder: str | Path, split: str = "train") -> TaskStore:
        """Read ``train``, ``val`` or ``cold.parquet`` and ``meta.json`` of a prepared folder."""
        folder = Path(folder)
        if split not in _SPLITS:
            raise MetaError(f"unknown split '{split}'; use one of: {', '.join(_SPLITS)}")
        meta = read_meta(folder)
        path = folder / _SPLITS[split]
        if not path.is_file():
            raise MetaError(f"{path}: no such file; {_PREPARE_FIX}")
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as exc:
            raise MetaError(f"{path}: not a readable Parquet file ({exc}); {_PREPARE_FIX} again") from None
        _check_columns(table, path)
        support, query = (_read_set(table, name, meta, path) for name in SETS)
        task_ids = table.column("task_id").to_numpy().astype(np.int64)
        return cls(task_ids, table.column("task_key").to_pylist(), support, query, meta, path)

    @property
    def num_tasks(self) -> int:
        return int(self.task_ids.shape[0])

    @property
    def support_sizes(self) -> np.ndarray:
        return self.support.count

    @property
    def query_sizes(self) -> np.ndarray:
        return self.query.count

    @property
    def sizes(self) -> np.ndarray:
        """Samples (support + query) per task: the load that ``plan_steps`` balances."""
        return self.support.count + self.query.count

    def batch(self, task_indices: Sequence[int] | np.ndarray) -> TaskBatch:
        """Tasks at these positions (0..num_tasks-1), padded to the batch's largest sets, ids deduplicated once."""
        tasks = np.asarray(task_indices, dtype=np.int64).reshape(-1)
        if tasks.size and (tasks.min() < 0 or tasks.max() >= self.num_tasks):
            raise IndexError(f"task index out of range 0..{self.num_tasks - 1}")
        sup = _gather(self.support, tasks)
        qry = _gather(self.query, tasks)
        unique, inverse = np.unique(np.concatenate([sup[0], qry[0]]).reshape(-1), return_inverse=True)
        inverse = inverse.reshape(-1, self.meta.num_sparse)
        split = sup[0].shape[0]
        return TaskBatch(
            task_ids=self.task_ids[tasks],
            unique_ids=unique.astype(np.int64),
            sup_idx=_scatter(inverse[:split], sup[3], np.int64),
            sup_dense=_scatter(sup[1], sup[3], np.float32),
            sup_label=_scatter(sup[2], sup[3], np.float32),
            sup_mask=sup[3],
            qry_idx=_scatter(inverse[split:], qry[3], np.int64),
            qry_dense=_scatter(qry[1], qry[3], np.float32),
            qry_label=_scatter(qry[2], qry[3], np.float32),
            qry_mask=qry[3],
        )

    def unique_ids(self, task_indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The deduplicated, sorted embedding ids of these tasks' support and query sets (``batch().unique_ids``)."""
        tasks = np.asarray(task_indices, dtype=np.int64).reshape(-1)
        parts = [_gather(arrays, tasks)[0].reshape(-1) for arrays in (self.support, self.query)]
        return np.unique(np.concatenate(parts)).astype(np.int64)


def _gather(arrays: _SetArrays, tasks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The real samples of these tasks, row-major by (task, position), and the [T, width] mask of real positions."""
    count = arrays.count[tasks]
    width = int(count.max()) if count.size else 0
    mask = np.arange(width)[None, :] < count[:, None]
    rows = (arrays.start[tasks][:, None] + np.arange(width)[None, :])[mask]
    return arrays.ids[rows], arrays.dense[rows], arrays.label[rows], mask


def _scatter(values: np.ndarray, mask: np.ndarray, dtype: type) -> np.ndarray:
    """Place rows of real samples into a zero-padded [T, S, ...] array at the mask's True positions."""
    out = np.zeros((*mask.shape, *values.shape[1:]), dtype=dtype)
    out[mask] = values
    return out


def _check_columns(table: pa.Table, path: Path) -> None:
    wanted = ["task_id", "task_key", *(f"{s}_{c}" for s in SETS for c in COLUMNS)]
    missing = [c for c in wanted if c not in table.column_names]
    if missing:
        raise MetaError(
            f"{path}: no column {', '.join(missing)} (columns are: {', '.join(table.column_names)}); "
            f"{_PREPARE_FIX} again"
        )


def read_meta(folder: str | Path) -> TaskMeta:
    """The TaskMeta of a prepared folder (``meta.json``)."""
    path = Path(folder) / META_FILE
    if not path.is_file():
        raise MetaError(f"{path}: no such file; {Path(folder)} is not a prepared folder, {_PREPARE_FIX}")
    try:
        return TaskMeta.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise MetaError(f"{path}: not a valid meta.json ({exc!r}); {_PREPARE_FIX} again") from None


# ---------------------------------------------------------------------------------------------- step plan


def plan_steps(
    sizes: Sequence[int] | np.ndarray, tasks_per_step: int, world: int, seed: int, epoch: int, drop_last: bool = True
) -> list[list[np.ndarray]]:
    """``steps[step][rank]``: task indices for every rank of every step of one epoch.

    Tasks are shuffled with ``default_rng((seed, epoch))`` and cut into global steps of ``tasks_per_step`` tasks,
    so the global task set of a step does not depend on ``world``. Within a step, tasks go largest first, round
    by round, to the least-loaded ranks (by samples), so ranks hold equal task counts (off by one at most) and
    near-equal samples. A rank may get no task when a step has fewer tasks than ranks.
    """
    if tasks_per_step < 1 or world < 1:
        raise MetaError(f"tasks_per_step ({tasks_per_step}) and world ({world}) must both be >= 1")
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    order = np.random.default_rng((seed, epoch)).permutation(sizes.shape[0])
    full = sizes.shape[0] // tasks_per_step
    steps = _assign(order[: full * tasks_per_step].reshape(full, tasks_per_step), sizes, world)
    rest = order[full * tasks_per_step :]
    if rest.size and not drop_last:
        steps += _assign(rest.reshape(1, -1), sizes, world)
    return steps


def _assign(tasks: np.ndarray, sizes: np.ndarray, world: int) -> list[list[np.ndarray]]:
    """Greedy by rounds, vectorised over steps: each round gives its largest tasks to the least-loaded ranks."""
    n_steps, per_step = tasks.shape
    by_size = np.take_along_axis(tasks, np.argsort(-sizes[tasks], axis=1, kind="stable"), axis=1)
    rank_of = np.empty_like(by_size)
    load = np.zeros((n_steps, world), dtype=np.int64)
    steps_axis = np.arange(n_steps)[:, None]
    for first in range(0, per_step, world):
        chunk = by_size[:, first : first + world]
        ranks = np.argsort(load, axis=1, kind="stable")[:, : chunk.shape[1]]
        rank_of[:, first : first + world] = ranks
        load[steps_axis, ranks] += sizes[chunk]  # ranks within a row are distinct
    return [[by_size[s][rank_of[s] == r] for r in range(world)] for s in range(n_steps)]


# ---------------------------------------------------------------------------------------------- loader


class _Failure:
    """An exception raised in the prefetch thread, carried to the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class MetaLoader:
    """This rank's TaskBatch per step of an epoch, prefetched ``prefetch`` deep by a background thread.

    Every rank's loader has the same ``len`` (0 when the split has fewer tasks than ``tasks_per_step`` and
    ``drop_last``); breaking out of the loop, or closing the iterator, stops the thread.
    """

    def __init__(
        self,
        store: TaskStore,
        tasks_per_step: int,
        rank: int,
        world: int,
        seed: int,
        epoch: int = 0,
        prefetch: int = 2,
        drop_last: bool = True,
        peer_ids: bool = False,
    ) -> None:
        if not 0 <= rank < world:
            raise MetaError(f"rank {rank} is outside 0..{world - 1} for world size {world}")
        self.store, self.tasks_per_step, self.rank, self.world = store, tasks_per_step, rank, world
        self.seed, self.epoch, self.prefetch, self.drop_last = seed, epoch, max(0, prefetch), drop_last
        self.peer_ids = peer_ids

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of this epoch from the next ``iter`` on."""
        self.epoch = epoch

    def plan(self) -> list[np.ndarray]:
        """This rank's task indices per step of the current epoch."""
        steps = plan_steps(self.store.sizes, self.tasks_per_step, self.world, self.seed, self.epoch, self.drop_last)
        return [step[self.rank] for step in steps]

    def __len__(self) -> int:
        n = self.store.num_tasks
        return n // self.tasks_per_step if self.drop_last else -(-n // self.tasks_per_step)

    def __iter__(self) -> Iterator[TaskBatch]:
        return self.iter_from(0)

    def iter_from(self, step: int) -> Iterator[TaskBatch]:
        """This epoch's batches from ``step`` on (resuming mid-epoch after a checkpoint)."""
        steps = plan_steps(self.store.sizes, self.tasks_per_step, self.world, self.seed, self.epoch, self.drop_last)[
            step:
        ]
        if self.prefetch == 0:
            return (self._build(tasks) for tasks in steps)
        return _prefetched(self._build, steps, self.prefetch)

    def _build(self, step_tasks: list[np.ndarray]) -> TaskBatch:
        """This rank's batch of one step, with every rank's unique ids when ``peer_ids`` was asked for."""
        batch = self.store.batch(step_tasks[self.rank])
        if self.peer_ids:
            batch.peer_ids = [
                batch.unique_ids if r == self.rank else self.store.unique_ids(tasks)
                for r, tasks in enumerate(step_tasks)
            ]
        return batch


def _prefetched(
    build: Callable[[list[np.ndarray]], TaskBatch], steps: list[list[np.ndarray]], depth: int
) -> Iterator[TaskBatch]:
    """Yield batches built by a worker thread through a bounded queue; closing the generator stops the worker."""
    out: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    worker = threading.Thread(target=_produce, args=(build, steps, out, stop), daemon=True, name="meta-prefetch")
    worker.start()
    try:
        while True:
            item = out.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        worker.join()


def _produce(
    build: Callable[[list[np.ndarray]], TaskBatch],
    steps: list[list[np.ndarray]],
    out: queue.Queue,
    stop: threading.Event,
) -> None:
    try:
        for step_tasks in steps:
            if not _put(out, build(step_tasks), stop):
                return
        _put(out, _DONE, stop)
    except BaseException as exc:  # carried to the consumer, which re-raises it
        _put(out, _Failure(exc), stop)


def _put(out: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put unless the consumer has stopped; False when it has."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False
