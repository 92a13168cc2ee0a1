"""Scoring a split's tasks after k-shot adaptation, for any source of embedding rows.

The trainer scores its validation tasks through the sharded table (a collective lookup that every rank makes
with the same ids), ``evaluate`` scores an exported model through its full table: both go through here, so the
figures a model is selected on and the figures it is reported with are computed the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from gpufleet.meta.loader import TaskStore
from gpufleet.meta.maml import MamlConfig, adapted_logits, dense_params
from gpufleet.meta.metrics import RankingScores, score_tasks
from gpufleet.meta.schema import TaskBatch

RowsOf = Callable[[np.ndarray], torch.Tensor]


def batch_scores(
    model: torch.nn.Module, rows_of: RowsOf, batch: TaskBatch, maml: MamlConfig
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(query scores, query labels) of each task of ``batch`` after adapting on its support set."""
    t = torch.from_numpy
    table = rows_of(batch.unique_ids)
    sup = (t(batch.sup_idx), t(batch.sup_dense), t(batch.sup_label), t(batch.sup_mask))
    logits = adapted_logits(model, dense_params(model), table, sup, t(batch.qry_idx), t(batch.qry_dense), maml)
    logits = logits.numpy()
    return [(logits[i][batch.qry_mask[i]], batch.qry_label[i][batch.qry_mask[i]]) for i in range(batch.num_tasks)]


def score_store(
    model: torch.nn.Module, rows_of: RowsOf, store: TaskStore, maml: MamlConfig, tasks_per_batch: int = 64
) -> RankingScores:
    """Pooled AUC, GAUC and NDCG@10 over every task of ``store``, in batches of ``tasks_per_batch`` tasks."""
    per_task: list[tuple[np.ndarray, np.ndarray]] = []
    for start in range(0, store.num_tasks, tasks_per_batch):
        indices = np.arange(start, min(start + tasks_per_batch, store.num_tasks))
        per_task.extend(batch_scores(model, rows_of, store.batch(indices), maml))
    return score_tasks(per_task)
