"""Turn interactions into one record per task (support and query sets), written as ``schema``'s Parquet files.

A task is every interaction of one value of the task column (a user by default). Its earliest ``support_size``
interactions by time (ties by file order) are the support set, the next ``query_size`` at most the query set;
tasks with fewer than ``support_size + min_query`` interactions are dropped. A ``cold_fraction`` of the tasks is
held out whole (``cold.parquet``) for cold-start evaluation: those whose first interaction is newest, or at random.
A ``val_fraction`` of the tasks is held out whole the same way from the rest (``val.parquet``: the next newest),
for every choice a trainer makes (epochs, inner rate and steps, variant); cold-start tasks are for the final score.

Vocabularies: each sparse feature's codes are the 1-based ranks of its sorted distinct string values over ALL rows
(train and cold tasks, dropped tasks too), so a cold task's items have embedding rows (untrained when only cold
tasks use them, which is the cold-start reality); code 0 is reserved for a missing value. The task id itself is no
feature unless ``include_task_id_feature``: a cold-start task's own embedding row would never have been trained.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from gpufleet.errors import MetaError
from gpufleet.meta.interactions import InteractionSpec, load_movielens_100k, read_interactions
from gpufleet.meta.schema import COLD_FILE, META_FILE, TRAIN_FILE, VAL_FILE, SparseFeature, TaskMeta

_MAX_REDRAWS = 64
SPLIT_CODES = {"train": 0, "val": 1, "cold": 2}


@dataclass(frozen=True)
class PrepareConfig:
    """How tasks are cut from interactions: task column, k-shot sizes, cold hold-out, negatives, labels, seed.

    ``label_threshold`` turns a numeric label (a rating) into 1 when >= threshold; None means the labels are
    already 0/1 (MovieLens-100k then uses 4). ``neg_per_pos`` applies to implicit feedback only.
    """

    task: str = "user"
    support_size: int = 10
    query_size: int = 20
    min_query: int = 5
    cold_fraction: float = 0.2
    cold_by: str = "time"
    val_fraction: float = 0.15
    neg_per_pos: int = 1
    label_threshold: float | None = None
    include_task_id_feature: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.support_size >= 1, "support_size must be >= 1"),
            (self.query_size >= 1, "query_size must be >= 1"),
            (1 <= self.min_query <= self.query_size, "min_query must be between 1 and query_size"),
            (0.0 <= self.cold_fraction < 1.0, "cold_fraction must be in [0, 1)"),
            (0.0 <= self.val_fraction < 1.0, "val_fraction must be in [0, 1)"),
            (self.cold_fraction + self.val_fraction < 1.0, "cold_fraction + val_fraction must be below 1"),
            (self.cold_by in ("time", "random"), "cold_by must be 'time' or 'random'"),
            (self.neg_per_pos >= 1, "neg_per_pos must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise MetaError(f"prepare options: {message} (got {self})")


@dataclass(frozen=True)
class PrepareSummary:
    """What a prepare run wrote, for the CLI to print."""

    out_dir: Path
    source: str
    interactions: int
    tasks_train: int
    tasks_cold: int
    tasks_val: int
    samples_train: int
    samples_cold: int
    samples_val: int
    positive_rate_train: float
    positive_rate_cold: float
    positive_rate_val: float
    dropped_tasks: int
    num_rows: int
    num_sparse: int
    num_dense: int
    seconds: float


@dataclass
class _Samples:
    """Every support/query sample as NumPy columns (feature codes 0-based within each feature, not yet offset)."""

    task: np.ndarray  # int64 task_id
    set: np.ndarray  # int8: 0 support, 1 query
    order: np.ndarray  # int64 position within the set's ordering
    codes: np.ndarray  # int64 [N, F]
    dense: np.ndarray  # float32 [N, D]
    label: np.ndarray  # float32 [N]


# ---------------------------------------------------------------------------------------------- public entry points


def prepare_movielens_100k(out_dir: str | Path, config: PrepareConfig | None = None) -> PrepareSummary:
    """Prepare MovieLens-100k (from the recbole wheel) into ``out_dir``; label = rating >= 4 unless configured."""
    config = config or PrepareConfig()
    start = time.perf_counter()
    threshold = 4.0 if config.label_threshold is None else config.label_threshold
    frame, spec = load_movielens_100k(threshold)
    return prepare_tasks(frame, config, out_dir, spec=spec, started=start)


def prepare_file(
    path: str | Path,
    columns: Mapping[str, str],
    config: PrepareConfig | None = None,
    out_dir: str | Path = "meta-tasks",
    *,
    sparse: Sequence[str] = (),
    dense: Sequence[str] = (),
) -> PrepareSummary:
    """Read a CSV/TSV/Parquet file through a column mapping (see ``read_interactions``) and prepare it."""
    config = config or PrepareConfig()
    start = time.perf_counter()
    frame, spec = read_interactions(path, columns, sparse=sparse, dense=dense, label_threshold=config.label_threshold)
    return prepare_tasks(frame, config, out_dir, spec=spec, started=start)


def prepare_tasks(
    interactions: pl.DataFrame,
    config: PrepareConfig,
    out_dir: str | Path,
    *,
    spec: InteractionSpec | None = None,
    started: float | None = None,
) -> PrepareSummary:
    """Cut a canonical interactions frame into tasks; write ``train``/``val``/``cold.parquet`` and ``meta.json``.

    Without ``spec`` the frame holds only ``user``, ``item``, ``time`` and an optional 0/1 ``label``.
    The three files are overwritten, each written to a temporary name first and renamed.
    """
    start = time.perf_counter() if started is None else started
    spec = spec or _default_spec(interactions)
    features = _feature_columns(interactions, spec, config)
    work, cards = _encode(interactions, spec, config, features)
    tasks = _task_table(work, config)
    kept = tasks.filter(pl.col("_kept"))
    samples_frame = _select_samples(work, kept, config)
    stats = _dense_stats(samples_frame, spec)
    samples = _to_numpy(samples_frame, features, spec, stats)
    neg_info: dict[str, Any] = {}
    if spec.implicit:
        samples, neg_info = _add_negatives(samples, work, kept, features, spec, stats, config)
    meta = _task_meta(features, cards, spec)
    info = _info(interactions, spec, config, tasks, kept, samples, stats, neg_info)
    meta = TaskMeta(meta.sparse, meta.dense, meta.num_rows, info)
    out = _write(Path(out_dir), samples, kept, meta)
    return _summary(out, spec, interactions, info, meta, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------- features


def _default_spec(frame: pl.DataFrame) -> InteractionSpec:
    for col in ("user", "item", "time"):
        if col not in frame.columns:
            raise MetaError(f"interactions frame: no '{col}' column; columns are: {', '.join(frame.columns)}")
    implicit = "label" not in frame.columns
    return InteractionSpec(
        source="interactions frame",
        implicit=implicit,
        label_rule="implicit: every row is a positive" if implicit else "label (0/1)",
        sparse=("user", "item"),
    )


def _feature_columns(frame: pl.DataFrame, spec: InteractionSpec, config: PrepareConfig) -> list[str]:
    """The sparse feature columns: the spec's, without the task column unless it is asked for."""
    if config.task not in frame.columns:
        raise MetaError(
            f"{spec.source}: task column '{config.task}' is not in the interactions; columns are: "
            f"{', '.join(frame.columns)}; pass --task user, --task item or another column"
        )
    features = [c for c in spec.sparse if c != config.task or config.include_task_id_feature]
    if not features:
        raise MetaError(
            f"{spec.source}: no sparse feature is left once the task column '{config.task}' is taken out; map "
            "extra sparse columns or include the task id as a feature"
        )
    return features


def _encode(
    frame: pl.DataFrame, spec: InteractionSpec, config: PrepareConfig, features: list[str]
) -> tuple[pl.DataFrame, list[int]]:
    """A working frame: task key, time, row, label, 0-based feature codes ``_f{i}`` and raw dense ``_d{j}``."""
    label = pl.lit(1.0, pl.Float32) if spec.implicit else pl.col("label").cast(pl.Float32)
    neg = _negative_column(config)
    work = frame.select(
        pl.col(config.task).cast(pl.Utf8).fill_null("").alias("_task"),
        pl.col("time").cast(pl.Float64).alias("_time"),
        pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_row"),
        label.alias("_label"),
        *[_code(c).alias(f"_f{i}") for i, c in enumerate(features)],
        *[pl.col(c).cast(pl.Float64).alias(f"_d{j}") for j, c in enumerate(spec.dense)],
    )
    neg_code = pl.col(f"_f{features.index(neg)}") if neg in features else pl.lit(0, pl.Int64)
    work = work.with_columns(neg_code.alias("_neg"))  # the entity negatives swap (implicit feedback only)
    maxima = work.select(pl.col(f"_f{i}").max() for i in range(len(features))).row(0)
    return work, [int(m or 0) + 1 for m in maxima]


def _code(col: str) -> pl.Expr:
    """1-based rank of the sorted distinct string values; 0 for a missing value."""
    return pl.col(col).cast(pl.Utf8).rank("dense").fill_null(0).cast(pl.Int64)


def _negative_column(config: PrepareConfig) -> str:
    """Negatives swap the entity on the other side of the task: items for user tasks, users for item tasks."""
    return "user" if config.task == "item" else "item"


def _task_meta(features: list[str], cards: list[int], spec: InteractionSpec) -> TaskMeta:
    offsets = np.concatenate([[0], np.cumsum(cards)]).astype(int)
    sparse = tuple(SparseFeature(name, cards[i], int(offsets[i])) for i, name in enumerate(features))
    return TaskMeta(sparse=sparse, dense=tuple(spec.dense), num_rows=int(offsets[-1]))


# ---------------------------------------------------------------------------------------------- tasks and sets


def _task_table(work: pl.DataFrame, config: PrepareConfig) -> pl.DataFrame:
    """One row per task: key, size, first time, kept flag, task_id (kept tasks by key order) and split."""
    need = config.support_size + config.min_query
    tasks = (
        work.group_by("_task")
        .agg(pl.len().alias("_n"), pl.col("_time").min().alias("_first"))
        .sort("_task")
        .with_columns((pl.col("_n") >= need).alias("_kept"))
    )
    kept = tasks.filter(pl.col("_kept"))
    if kept.height == 0:
        raise MetaError(
            f"no task has {need} interactions (support_size {config.support_size} + min_query "
            f"{config.min_query}); the largest has {tasks['_n'].max()}; lower --support-size or --min-query"
        )
    split = _split_flags(kept, config)
    kept = kept.with_columns(
        pl.int_range(0, pl.len(), dtype=pl.Int64).alias("task_id"),
        pl.Series("_split", split),
    )
    return tasks.join(kept.select("_task", "task_id", "_split"), on="_task", how="left")


def _split_flags(kept: pl.DataFrame, config: PrepareConfig) -> np.ndarray:
    """Each kept task's split (``SPLIT_CODES``): the newest by first interaction (or a seeded random set) are
    cold-start, the next newest validation, the rest training; at least one training task always remains."""
    n = kept.height
    n_cold = max(0, min(round(config.cold_fraction * n), n - 1))
    n_val = max(0, min(round(config.val_fraction * n), n - 1 - n_cold))
    split = np.zeros(n, dtype=np.int8)
    if config.cold_by == "time":
        order = np.lexsort((np.arange(n), kept["_first"].to_numpy()))
    else:
        order = np.random.default_rng(config.seed).permutation(n)
    split[order[n - n_cold - n_val : n - n_cold]] = SPLIT_CODES["val"]
    split[order[n - n_cold :]] = SPLIT_CODES["cold"]
    return split


def _select_samples(work: pl.DataFrame, kept: pl.DataFrame, config: PrepareConfig) -> pl.DataFrame:
    """Rows that become samples: per kept task, sorted by (time, file row), the first k + query_size."""
    k, q = config.support_size, config.query_size
    return (
        work.join(kept.select("_task", "task_id", "_split"), on="_task", how="inner")
        .sort("task_id", "_time", "_row")
        .with_columns(pl.int_range(0, pl.len(), dtype=pl.Int64).over("task_id").alias("_pos"))
        .filter(pl.col("_pos") < k + q)
        .with_columns((pl.col("_pos") >= k).cast(pl.Int8).alias("_set"))
    )


def _dense_stats(samples: pl.DataFrame, spec: InteractionSpec) -> dict[str, tuple[float, float]]:
    """Mean and std (1 where 0 or unknown) of each standardised dense column over the train tasks' samples."""
    train = samples.filter(pl.col("_split") == SPLIT_CODES["train"])
    stats = {}
    for j, col in enumerate(spec.dense):
        if col not in spec.standardise:
            continue
        mean, std = train.select(pl.col(f"_d{j}").mean().alias("m"), pl.col(f"_d{j}").std(ddof=0).alias("s")).row(0)
        stats[col] = (float(mean or 0.0), float(std) if std else 1.0)
    return stats


def _dense_exprs(spec: InteractionSpec, stats: dict[str, tuple[float, float]]) -> list[pl.Expr]:
    """Dense columns as float32: standardised where asked, missing values as 0 (the mean)."""
    out = []
    for j, col in enumerate(spec.dense):
        expr = pl.col(f"_d{j}")
        if col in stats:
            mean, std = stats[col]
            expr = (expr - mean) / std
        out.append(expr.fill_null(0.0).fill_nan(0.0).cast(pl.Float32))
    return out


def _to_numpy(
    frame: pl.DataFrame, features: list[str], spec: InteractionSpec, stats: dict[str, tuple[float, float]]
) -> _Samples:
    n = frame.height
    codes = frame.select(f"_f{i}" for i in range(len(features))).to_numpy().astype(np.int64).reshape(n, -1)
    dense = (
        frame.select(_dense_exprs(spec, stats)).to_numpy().astype(np.float32).reshape(n, -1)
        if spec.dense
        else np.zeros((n, 0), np.float32)
    )
    return _Samples(
        task=frame["task_id"].to_numpy().astype(np.int64),
        set=frame["_set"].to_numpy().astype(np.int8),
        order=frame["_pos"].to_numpy().astype(np.int64),
        codes=codes,
        dense=dense,
        label=frame["_label"].to_numpy().astype(np.float32),
    )


# ---------------------------------------------------------------------------------------------- negatives


def _add_negatives(
    samples: _Samples,
    work: pl.DataFrame,
    kept: pl.DataFrame,
    features: list[str],
    spec: InteractionSpec,
    stats: dict[str, tuple[float, float]],
    config: PrepareConfig,
) -> tuple[_Samples, dict[str, Any]]:
    """Implicit feedback: after each positive, ``neg_per_pos`` negatives whose entity the task never touched.

    A negative copies its positive and swaps the entity (item for user tasks) and the features that are constant
    per entity (item-side features), drawn uniformly over all entities with a generator seeded by ``seed``.
    """
    neg_col = _negative_column(config)
    if neg_col not in features:
        raise MetaError(f"{spec.source}: implicit feedback needs '{neg_col}' as a sparse feature to draw negatives")
    n_ent = int(work["_neg"].max() or 0)
    touched = _touched_keys(work, kept, n_ent)
    pos_rows = np.repeat(np.arange(samples.task.shape[0]), config.neg_per_pos)
    rng = np.random.default_rng(config.seed)
    drawn = _draw_negatives(samples.task[pos_rows], touched, n_ent, rng, kept)
    side_sparse, side_dense = _side_columns(work, features, spec, neg_col)
    table_codes, table_dense = _side_tables(work, features, spec, stats, side_sparse, side_dense, n_ent)
    codes = samples.codes[pos_rows].copy()
    dense = samples.dense[pos_rows].copy()
    codes[:, features.index(neg_col)] = table_codes[drawn, 0]
    codes[:, side_sparse] = table_codes[drawn, 1:]
    dense[:, side_dense] = table_dense[drawn]
    rank = np.tile(np.arange(1, config.neg_per_pos + 1), samples.task.shape[0])
    stride = config.neg_per_pos + 1
    negatives = _Samples(
        task=samples.task[pos_rows],
        set=samples.set[pos_rows],
        order=samples.order[pos_rows] * stride + rank,
        codes=codes,
        dense=dense,
        label=np.zeros(pos_rows.shape[0], np.float32),
    )
    samples.order = samples.order * stride
    side = [features[i] for i in side_sparse] + [spec.dense[j] for j in side_dense]
    return _concat(samples, negatives), {"negative_entity": neg_col, "negative_side_features": side}


def _touched_keys(work: pl.DataFrame, kept: pl.DataFrame, n_ent: int) -> np.ndarray:
    """Sorted ``task_id * (n_ent + 1) + entity`` for every (kept task, entity) pair in all its interactions."""
    pairs = work.join(kept.select("_task", "task_id"), on="_task", how="inner").select("task_id", "_neg")
    keys = pairs["task_id"].to_numpy().astype(np.int64) * (n_ent + 1) + pairs["_neg"].to_numpy().astype(np.int64)
    keys.sort()
    return keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if keys.size else keys


def _draw_negatives(
    tasks: np.ndarray, touched: np.ndarray, n_ent: int, rng: np.random.Generator, kept: pl.DataFrame
) -> np.ndarray:
    """Uniform entity codes in 1..n_ent, redrawn (vectorised) until none is one the task touched."""
    drawn = rng.integers(1, n_ent + 1, size=tasks.shape[0])
    for _ in range(_MAX_REDRAWS):
        bad = np.flatnonzero(_is_member(tasks * (n_ent + 1) + drawn, touched))
        if bad.size == 0:
            return drawn
        drawn[bad] = rng.integers(1, n_ent + 1, size=bad.size)
    for i in np.flatnonzero(_is_member(tasks * (n_ent + 1) + drawn, touched)):
        drawn[i] = _draw_exact(int(tasks[i]), touched, n_ent, rng, kept)
    return drawn


def _is_member(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    at = np.searchsorted(sorted_keys, keys)
    return (at < sorted_keys.size) & (sorted_keys[np.minimum(at, sorted_keys.size - 1)] == keys)


def _draw_exact(task: int, touched: np.ndarray, n_ent: int, rng: np.random.Generator, kept: pl.DataFrame) -> int:
    """Fallback for a task that touched almost every entity: draw from its explicit complement."""
    lo, hi = np.searchsorted(touched, [task * (n_ent + 1), (task + 1) * (n_ent + 1)])
    free = np.setdiff1d(np.arange(1, n_ent + 1), touched[lo:hi] - task * (n_ent + 1))
    if free.size == 0:
        key = kept.filter(pl.col("task_id") == task)["_task"][0]
        raise MetaError(f"task '{key}' touched every entity, so no negative can be drawn for it; drop that task")
    return int(rng.choice(free))


def _side_columns(
    work: pl.DataFrame, features: list[str], spec: InteractionSpec, neg_col: str
) -> tuple[list[int], list[int]]:
    """Indices of the sparse and dense features that are constant per negative entity (its side features)."""
    cols = [f"_f{i}" for i in range(len(features))] + [f"_d{j}" for j in range(len(spec.dense))]
    if not cols:
        return [], []
    per = work.group_by("_neg").agg(pl.col(c).n_unique() for c in cols).select(pl.col(cols).max()).row(0)
    constant = dict(zip(cols, per, strict=True))
    own = features.index(neg_col)
    sparse = [i for i in range(len(features)) if i != own and constant[f"_f{i}"] <= 1]
    dense = [j for j in range(len(spec.dense)) if constant[f"_d{j}"] <= 1]
    return sparse, dense


def _side_tables(
    work: pl.DataFrame,
    features: list[str],
    spec: InteractionSpec,
    stats: dict[str, tuple[float, float]],
    side_sparse: list[int],
    side_dense: list[int],
    n_ent: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per entity code: [own code, side sparse codes...] and side dense values (standardised), row 0 empty."""
    dense_exprs = _dense_exprs(spec, stats)
    first = work.group_by("_neg").agg(
        *[pl.col(f"_f{i}").first() for i in side_sparse],
        *[dense_exprs[j].first().alias(f"_d{j}") for j in side_dense],
    )
    ent = first["_neg"].to_numpy().astype(np.int64)
    codes = np.zeros((n_ent + 1, 1 + len(side_sparse)), np.int64)
    codes[ent, 0] = ent
    for col, i in enumerate(side_sparse, start=1):
        codes[ent, col] = first[f"_f{i}"].to_numpy()
    dense = np.zeros((n_ent + 1, len(side_dense)), np.float32)
    for col, j in enumerate(side_dense):
        dense[ent, col] = first[f"_d{j}"].to_numpy()
    return codes, dense


def _concat(a: _Samples, b: _Samples) -> _Samples:
    return _Samples(
        *(np.concatenate([getattr(a, f), getattr(b, f)]) for f in ("task", "set", "order", "codes", "dense", "label"))
    )


# ---------------------------------------------------------------------------------------------- writing


def _split_table(
    samples: _Samples, rows: np.ndarray, task_ids: np.ndarray, keys: list[str], offsets: np.ndarray
) -> pa.Table:
    """One Parquet row per task of ``task_ids`` with its support and query sets flattened row-major."""
    rows = rows[np.lexsort((samples.order[rows], samples.set[rows], samples.task[rows]))]
    local = np.searchsorted(task_ids, samples.task[rows])
    columns: dict[str, pa.Array] = {
        "task_id": pa.array(task_ids, pa.int64()),
        "task_key": pa.array(keys, pa.string()),
    }
    for set_index, name in enumerate(("support", "query")):
        chosen = rows[samples.set[rows] == set_index]
        counts = np.bincount(local[samples.set[rows] == set_index], minlength=task_ids.shape[0])
        columns[f"{name}_sparse"] = _list(samples.codes[chosen] + offsets, counts, pa.int64())
        columns[f"{name}_dense"] = _list(samples.dense[chosen], counts, pa.float32())
        columns[f"{name}_label"] = _list(samples.label[chosen], counts, pa.float32())
    return pa.Table.from_arrays(list(columns.values()), names=list(columns))


def _list(values: np.ndarray, counts: np.ndarray, dtype: pa.DataType) -> pa.Array:
    """A list array whose i-th entry holds ``counts[i]`` rows of ``values`` (rows flattened row-major)."""
    width = values.shape[1] if values.ndim == 2 else 1
    offsets = np.concatenate([[0], np.cumsum(counts * width)])
    flat = pa.array(np.ascontiguousarray(values).reshape(-1), dtype)
    if offsets[-1] >= 2**31:
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), flat)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat)


def _write(out_dir: Path, samples: _Samples, kept: pl.DataFrame, meta: TaskMeta) -> Path:
    """Write the three splits and meta.json to temporary names, then rename them into place."""
    out_dir.mkdir(parents=True, exist_ok=True)
    offsets = np.array([f.offset for f in meta.sparse], np.int64)
    split_of_task = kept.sort("task_id")["_split"].to_numpy()
    keys = kept.sort("task_id")["_task"].to_list()
    staged = []
    for name, code in ((TRAIN_FILE, 0), (VAL_FILE, 1), (COLD_FILE, 2)):
        wanted = np.flatnonzero(split_of_task == code)
        rows = np.flatnonzero(np.isin(samples.task, wanted))
        table = _split_table(samples, rows, wanted.astype(np.int64), [keys[i] for i in wanted], offsets)
        tmp = out_dir / f".{name}.tmp"
        pq.write_table(table, tmp)
        staged.append((tmp, out_dir / name))
    tmp = out_dir / f".{META_FILE}.tmp"
    tmp.write_text(json.dumps(meta.to_json(), indent=2) + "\n")
    staged.append((tmp, out_dir / META_FILE))
    for src, dst in staged:
        os.replace(src, dst)
    return out_dir


# ---------------------------------------------------------------------------------------------- info and summary


def _split_counts(samples: _Samples, split_of_task: np.ndarray) -> dict[str, dict[str, Any]]:
    split = split_of_task[samples.task]
    out = {}
    for name, code in SPLIT_CODES.items():
        mask = split == code
        labels = samples.label[mask]
        out[name] = {
            "support": int((mask & (samples.set == 0)).sum()),
            "query": int((mask & (samples.set == 1)).sum()),
            "positive_rate": round(float(labels.mean()), 6) if labels.size else 0.0,
        }
    return out


def _info(
    frame: pl.DataFrame,
    spec: InteractionSpec,
    config: PrepareConfig,
    tasks: pl.DataFrame,
    kept: pl.DataFrame,
    samples: _Samples,
    stats: dict[str, tuple[float, float]],
    neg_info: dict[str, Any],
) -> dict[str, Any]:
    split_of_task = kept.sort("task_id")["_split"].to_numpy()
    counts = _split_counts(samples, split_of_task)
    n_split = {name: int((split_of_task == code).sum()) for name, code in SPLIT_CODES.items()}
    info: dict[str, Any] = {
        "source": spec.source,
        "label_rule": spec.label_rule,
        "time_rule": spec.time_rule,
        "implicit": spec.implicit,
        "config": asdict(config),
        "interactions": frame.height,
        "tasks": n_split,
        "dropped_tasks": tasks.height - kept.height,
        "dropped_rule": f"fewer than support_size + min_query = {config.support_size + config.min_query} interactions",
        "samples": counts,
        "vocabulary": "codes are 1-based ranks of each feature's sorted distinct string values over all rows "
        "(train, val, cold and dropped tasks); code 0 = missing",
        "dense_standardised": {c: {"mean": m, "std": s} for c, (m, s) in stats.items()},
    }
    if spec.implicit:
        info["negatives"] = {
            "per_positive": config.neg_per_pos,
            "sampling": "uniform over entities the task never touched, per set, seeded",
            **neg_info,
        }
    return info


def _summary(
    out: Path, spec: InteractionSpec, frame: pl.DataFrame, info: dict[str, Any], meta: TaskMeta, seconds: float
) -> PrepareSummary:
    samples = info["samples"]
    return PrepareSummary(
        out_dir=out,
        source=spec.source,
        interactions=frame.height,
        tasks_train=info["tasks"]["train"],
        tasks_cold=info["tasks"]["cold"],
        tasks_val=info["tasks"]["val"],
        samples_train=samples["train"]["support"] + samples["train"]["query"],
        samples_cold=samples["cold"]["support"] + samples["cold"]["query"],
        samples_val=samples["val"]["support"] + samples["val"]["query"],
        positive_rate_train=samples["train"]["positive_rate"],
        positive_rate_cold=samples["cold"]["positive_rate"],
        positive_rate_val=samples["val"]["positive_rate"],
        dropped_tasks=info["dropped_tasks"],
        num_rows=meta.num_rows,
        num_sparse=meta.num_sparse,
        num_dense=meta.num_dense,
        seconds=round(seconds, 3),
    )
