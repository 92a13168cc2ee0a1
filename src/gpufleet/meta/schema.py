"""The task-record format shared by ``prepare`` (writer), the Meta-IO loader and the trainers (readers).

A prepared folder holds ``train.parquet``, ``val.parquet`` (tasks held out whole, for every choice made in
training: epochs, inner rate and steps, variant) and ``cold.parquet`` (tasks held out whole, scored once, for
cold-start evaluation) plus ``meta.json``. Each Parquet row is one task; each sample set is stored flattened
row-major so that a task converts to NumPy without per-sample Python objects:

- ``task_id`` int64, ``task_key`` string (the original key: user id, item id, ...)
- ``support_sparse`` list<int64>: n_support × F global embedding-row ids (feature offsets already added)
- ``support_dense`` list<float32>: n_support × D dense features (D may be 0)
- ``support_label`` list<float32>: n_support labels in {0, 1}
- ``query_sparse`` / ``query_dense`` / ``query_label``: the same for the query set

Global ids: sparse feature f's value v (0-based within the feature) is row ``offset_f + v`` of one concatenated
embedding table of ``num_rows`` rows, as TorchRec's fused tables do; rows are sharded across ranks by
``id % world``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

TRAIN_FILE = "train.parquet"
COLD_FILE = "cold.parquet"
VAL_FILE = "val.parquet"
META_FILE = "meta.json"
SETS = ("support", "query")
COLUMNS = ("sparse", "dense", "label")


@dataclass(frozen=True)
class SparseFeature:
    """One categorical feature: its name, number of distinct values, and first row in the concatenated table."""

    name: str
    cardinality: int
    offset: int


@dataclass(frozen=True)
class TaskMeta:
    """What ``meta.json`` says about a prepared folder: feature layout, sizes and how it was made."""

    sparse: tuple[SparseFeature, ...]
    dense: tuple[str, ...]
    num_rows: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_sparse(self) -> int:
        return len(self.sparse)

    @property
    def num_dense(self) -> int:
        return len(self.dense)

    def to_json(self) -> dict[str, Any]:
        return {
            "sparse": [{"name": f.name, "cardinality": f.cardinality, "offset": f.offset} for f in self.sparse],
            "dense": list(self.dense),
            "num_rows": self.num_rows,
            "info": self.info,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskMeta:
        sparse = tuple(SparseFeature(f["name"], int(f["cardinality"]), int(f["offset"])) for f in data["sparse"])
        return cls(
            sparse=sparse, dense=tuple(data["dense"]), num_rows=int(data["num_rows"]), info=dict(data.get("info", {}))
        )


@dataclass
class TaskBatch:
    """Whole tasks for one rank and one meta-step, padded to the batch's largest support / query set.

    The ids of support and query are deduplicated once (``unique_ids``) so one lookup serves both passes;
    ``*_idx`` index into ``unique_ids``. Padded positions have mask False, label 0 and index 0.
    """

    task_ids: np.ndarray  # int64 [T]
    unique_ids: np.ndarray  # int64 [U], global embedding rows
    sup_idx: np.ndarray  # int64 [T, S, F]
    sup_dense: np.ndarray  # float32 [T, S, D]
    sup_label: np.ndarray  # float32 [T, S]
    sup_mask: np.ndarray  # bool [T, S]
    qry_idx: np.ndarray  # int64 [T, Q, F]
    qry_dense: np.ndarray  # float32 [T, Q, D]
    qry_label: np.ndarray  # float32 [T, Q]
    qry_mask: np.ndarray  # bool [T, Q]
    # unique_ids of every rank's batch of this step (peer_ids[rank] is this batch's own), when the loader was
    # asked for them: each rank then knows which of its rows the others will request, with no id exchange
    peer_ids: list[np.ndarray] | None = None

    @property
    def num_tasks(self) -> int:
        return int(self.task_ids.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.sup_mask.sum() + self.qry_mask.sum())
