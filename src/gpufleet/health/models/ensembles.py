"""The paper's two ensembles, each an estimator made of estimators (scikit-learn's shape).

- **Parallel**: every member ranks the GPUs of a prediction round; an alert needs all members to put the
  GPU in their top-K. The intersection is smaller than K: precision rises, recall falls.
- **Cascade**: a 1D-CNN filters out the instances it finds healthy (a score below what it gives all but the
  top ``keep`` share of healthy training instances); an MLP trained only on what passes the filter ranks
  the rest. The MLP specialises in the hard cases the filter could not clear.

Scores of instances an ensemble does not alert on are ``-inf``; top-K alerting then raises fewer than K
alerts, which is the point.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpufleet.health.models.base import FailureModel, make_model, register_model
from gpufleet.health.samples import Samples

#: default alert budget: alerts per GPU per prediction round (5 a day on 20,000 GPUs, about the number of
#: GPUs a day that fail within the horizon after a visible precursor)
DEFAULT_BUDGET = 2.5e-4


def top_k_per_round(times: np.ndarray, scores: np.ndarray, budget: float) -> np.ndarray:
    """Boolean mask of the instances alerted: in each round (equal ``times``) the ``k`` best finite scores,
    ``k = max(1, round(budget x instances in the round))``."""
    alerted = np.zeros(len(scores), dtype=bool)
    if len(scores) == 0:
        return alerted
    order = np.lexsort((-scores, times))
    t_sorted = times[order]
    starts = np.flatnonzero(np.r_[True, t_sorted[1:] != t_sorted[:-1]])
    ends = np.r_[starts[1:], len(order)]
    for s, e in zip(starts, ends, strict=True):
        k = max(1, round(budget * (e - s)))
        top = order[s:min(e, s + k)]
        alerted[top[np.isfinite(scores[top])]] = True
    return alerted


def _rank_percentile(times: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Each score's percentile within its round (1 = the highest)."""
    out = np.empty(len(scores), dtype=np.float64)
    for t in np.unique(times):
        idx = np.flatnonzero(times == t)
        ranks = np.argsort(np.argsort(scores[idx]))
        out[idx] = (ranks + 1) / len(idx)
    return out


@register_model("parallel", "intersection of the members' top-K (default gbdt, mlp, cnn1d)")
class ParallelEnsemble:
    """Alert only where every member has the instance in its top-K of the round."""

    name = "parallel"

    def __init__(self, members: Sequence[str | FailureModel] = ("gbdt", "mlp", "cnn1d"),
                 budget: float = DEFAULT_BUDGET, member_factor: float = 1.0, seed: int = 0) -> None:
        self.members = [make_model(m, seed=seed) if isinstance(m, str) else m for m in members]
        if len(self.members) < 2:
            raise ValueError("a parallel ensemble needs at least two members")
        self.budget = budget
        #: each member's top-K is ``member_factor`` times the ensemble's budget. 1 is the paper's design (the
        #: intersection of equal top-K sets: fewer, surer alerts); larger factors trade precision for recall
        self.member_factor = member_factor

    def fit(self, samples: Samples) -> ParallelEnsemble:
        for m in self.members:
            m.fit(samples)
        return self

    def score(self, samples: Samples) -> np.ndarray:
        return self.combine(samples.time, [m.score(samples) for m in self.members])

    def combine(self, times: np.ndarray, member_scores: list[np.ndarray]) -> np.ndarray:
        """The ensemble's scores from its members' scores on the same instances."""
        together = np.ones(len(times), dtype=bool)
        for s in member_scores:
            together &= top_k_per_round(times, s, self.budget * self.member_factor)
        out = np.full(len(times), -np.inf)
        if together.any():
            mean_pct = np.mean([_rank_percentile(times, s) for s in member_scores], axis=0)
            out[together] = mean_pct[together]
        return out


@register_model("cascade", "a 1D-CNN filters out healthy instances, an MLP ranks the rest")
class CascadeEnsemble:
    """Two stages: a recall-oriented filter, then a classifier trained on what the filter lets through."""

    name = "cascade"

    def __init__(self, filter: str | FailureModel = "cnn1d", classifier: str | FailureModel = "mlp",
                 keep: float = 0.03, seed: int = 0) -> None:
        self.filter = make_model(filter, seed=seed) if isinstance(filter, str) else filter
        self.classifier = make_model(classifier, seed=seed) if isinstance(classifier, str) else classifier
        if not 0 < keep < 1:
            raise ValueError(f"cascade keep={keep} must be a share in (0, 1)")
        self.keep = keep
        self.cutoff: float | None = None
        self._filter_fitted = False

    def with_fitted_filter(self, model: FailureModel) -> CascadeEnsemble:
        """Reuse a filter model already fitted on the same training instances (saves a second fit)."""
        self.filter, self._filter_fitted = model, True
        return self

    def fit(self, samples: Samples) -> CascadeEnsemble:
        if samples.y is None:
            raise ValueError("CascadeEnsemble.fit needs labelled samples")
        if not self._filter_fitted:
            self.filter.fit(samples)
        s = self.filter.score(samples)
        # the cut is set on healthy instances, whose share in the field the training sample preserves
        self.cutoff = float(np.quantile(s[samples.y == 0], 1 - self.keep))
        passed = s >= self.cutoff
        if samples.y[passed].sum() == 0:
            passed = s >= np.min(s[samples.y == 1])  # never train the classifier without a positive
        self.classifier.fit(samples.take(np.flatnonzero(passed)))
        return self

    def score(self, samples: Samples) -> np.ndarray:
        return self.combine(samples, self.filter.score(samples))

    def combine(self, samples: Samples, filter_scores: np.ndarray) -> np.ndarray:
        """The ensemble's scores given the filter's scores on ``samples``."""
        if self.cutoff is None:
            raise ValueError("CascadeEnsemble.score called before fit")
        out = np.full(len(samples), -np.inf)
        passed = np.flatnonzero(filter_scores >= self.cutoff)
        if len(passed):
            out[passed] = self.classifier.score(samples.take(passed))
        return out
