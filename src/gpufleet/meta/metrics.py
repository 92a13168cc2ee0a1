"""Ranking metrics: pooled AUC (the CTR models' AUC, over every query sample), per-task AUC averaged over tasks
(GAUC, which ignores each task's base rate) and NDCG@k per task with binary gains (Mann-Whitney with tied ranks).

A task counts toward GAUC only when its query set has both classes, and toward NDCG only when it has a
positive; the counts are reported so that a figure is never an average over nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

SELECT_METRICS = ("auc", "gauc", "mean")


def task_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC of one task's scores (NaN when the labels have a single class)."""
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def task_ndcg(scores: np.ndarray, labels: np.ndarray, k: int = 10) -> float:
    """NDCG@k of one task with binary gains (NaN when it has no positive). Ties keep input order."""
    gains = (labels > 0.5).astype(np.float64)
    if gains.sum() == 0:
        return float("nan")
    order = np.argsort(-scores, kind="stable")[:k]
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = float((gains[order] * discounts[: len(order)]).sum())
    ideal = np.sort(gains)[::-1][:k]
    idcg = float((ideal * discounts[: len(ideal)]).sum())
    return dcg / idcg


@dataclass(frozen=True)
class RankingScores:
    """Pooled AUC, mean per-task AUC (GAUC) and NDCG@10, with how many tasks each mean covers."""

    auc: float
    gauc: float
    ndcg_at_10: float
    tasks: int
    auc_tasks: int
    ndcg_tasks: int
    samples: int

    def to_json(self) -> dict[str, float | int]:
        return {
            "auc": self.auc,
            "gauc": self.gauc,
            "ndcg_at_10": self.ndcg_at_10,
            "tasks": self.tasks,
            "auc_tasks": self.auc_tasks,
            "ndcg_tasks": self.ndcg_tasks,
            "samples": self.samples,
        }


def score_tasks(per_task: list[tuple[np.ndarray, np.ndarray]]) -> RankingScores:
    """Per-task (scores, labels) -> pooled AUC, and mean AUC / NDCG@10 over the tasks where each is defined."""
    aucs = np.array([task_auc(s, y) for s, y in per_task], dtype=np.float64)
    ndcgs = np.array([task_ndcg(s, y) for s, y in per_task], dtype=np.float64)
    ok_auc, ok_ndcg = ~np.isnan(aucs), ~np.isnan(ndcgs)
    pooled = (
        task_auc(np.concatenate([s for s, _ in per_task]), np.concatenate([y for _, y in per_task]))
        if per_task
        else float("nan")
    )
    return RankingScores(
        auc=pooled,
        gauc=float(aucs[ok_auc].mean()) if ok_auc.any() else float("nan"),
        ndcg_at_10=float(ndcgs[ok_ndcg].mean()) if ok_ndcg.any() else float("nan"),
        tasks=len(per_task),
        auc_tasks=int(ok_auc.sum()),
        ndcg_tasks=int(ok_ndcg.sum()),
        samples=int(sum(len(y) for _, y in per_task)),
    )


def selection_score(scores: RankingScores, metric: str = "mean") -> float:
    """The one number a choice is made on: pooled AUC, GAUC, or their mean (``mean``: neither a model that only
    learns each task's base rate nor one that only re-ranks within tasks wins by itself). NaN counts as -inf."""
    value = {"auc": scores.auc, "gauc": scores.gauc, "mean": 0.5 * (scores.auc + scores.gauc)}[metric]
    return float("-inf") if np.isnan(value) else float(value)
