"""Per-task AUC and NDCG@10 agree with scikit-learn's implementations on random tasks."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.meta.metrics import score_tasks, task_auc, task_ndcg

metrics = pytest.importorskip("sklearn.metrics")


@pytest.mark.parametrize("seed", range(5))
def test_auc_and_ndcg_match_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    labels = (rng.random(n) < 0.4).astype(np.float32)
    labels[0], labels[1] = 1.0, 0.0
    scores = np.round(rng.normal(size=n), 1)  # rounding makes ties, which AUC must average
    assert task_auc(scores, labels) == pytest.approx(metrics.roc_auc_score(labels, scores))
    distinct = rng.permutation(n).astype(np.float64)
    assert task_ndcg(distinct, labels) == pytest.approx(metrics.ndcg_score(labels[None], distinct[None], k=10))


def test_undefined_tasks_are_counted_not_averaged():
    both = (np.array([0.9, 0.1]), np.array([1.0, 0.0]))
    only_pos = (np.array([0.3, 0.2]), np.array([1.0, 1.0]))
    only_neg = (np.array([0.3, 0.2]), np.array([0.0, 0.0]))
    scores = score_tasks([both, only_pos, only_neg])
    assert scores.gauc == 1.0 and scores.auc_tasks == 1
    pooled = metrics.roc_auc_score([1, 0, 1, 1, 0, 0], [0.9, 0.1, 0.3, 0.2, 0.3, 0.2])
    assert scores.auc == pytest.approx(pooled)
    assert scores.ndcg_tasks == 2 and scores.tasks == 3 and scores.samples == 6
    assert np.isnan(task_auc(*only_pos)) and np.isnan(task_ndcg(*only_neg))
