"""The baselines a practitioner tries before any model: item popularity, and popularity plus a per-task bias.

Both read the same k-shot support sets as the meta model and no query label. ``popularity`` scores a sample by
the smoothed positive rate of its entity (the item for user tasks, the user for item tasks) over the training
tasks' samples; ``task_bias`` adds the task's own smoothed support rate (in logits), which moves whole tasks up
or down (pooled AUC) but cannot re-rank inside one (its GAUC is popularity's). The smoothing strength is the
one hyper-parameter, chosen on the validation tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufleet.errors import MetaError
from gpufleet.meta.loader import TaskStore
from gpufleet.meta.metrics import RankingScores, score_tasks

STRENGTHS = (1.0, 10.0, 100.0)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def entity_column(store: TaskStore) -> int:
    """Which sparse feature is the entity a task's samples are about: the item (user tasks) or the user."""
    names = [f.name for f in store.meta.sparse]
    task = str(store.meta.info.get("config", {}).get("task", "user"))
    for name in ("item", "user") if task != "item" else ("user", "item"):
        if name in names and name != task:
            return names.index(name)
    raise MetaError(f"{store.path}: no item or user feature to count popularity on; features are {', '.join(names)}")


@dataclass(frozen=True)
class Popularity:
    """Per-entity positive and sample counts over the training tasks, and the overall positive rate."""

    column: int
    positives: np.ndarray
    counts: np.ndarray
    prior: float

    @classmethod
    def fit(cls, train: TaskStore) -> Popularity:
        column = entity_column(train)
        ids = np.concatenate([train.support.ids[:, column], train.query.ids[:, column]])
        labels = np.concatenate([train.support.label, train.query.label]).astype(np.float64)
        size = train.meta.num_rows
        return cls(
            column=column,
            positives=np.bincount(ids, weights=labels, minlength=size),
            counts=np.bincount(ids, minlength=size).astype(np.float64),
            prior=float(labels.mean()) if labels.size else 0.5,
        )

    def logits(self, ids: np.ndarray, strength: float) -> np.ndarray:
        """Smoothed log-odds of each entity: (positives + strength * prior) / (count + strength)."""
        rate = (self.positives[ids] + strength * self.prior) / (self.counts[ids] + strength)
        return _logit(rate)


def score_baseline(pop: Popularity, store: TaskStore, strength: float, task_bias: bool) -> RankingScores:
    """Popularity (plus the task's smoothed support rate when ``task_bias``) on every task of ``store``."""
    per_task = []
    for t in range(store.num_tasks):
        q0, qn = store.query.start[t], store.query.count[t]
        s0, sn = store.support.start[t], store.support.count[t]
        scores = pop.logits(store.query.ids[q0 : q0 + qn, pop.column], strength)
        if task_bias:
            sup = store.support.label[s0 : s0 + sn].astype(np.float64)
            rate = (sup.sum() + strength * pop.prior) / (sn + strength)
            scores = scores + _logit(np.array(rate)) - _logit(np.array(pop.prior))
        per_task.append((scores, store.query.label[q0 : q0 + qn]))
    return score_tasks(per_task)
