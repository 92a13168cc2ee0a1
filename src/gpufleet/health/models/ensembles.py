"""The paper's two ensembles, each an estimator made of estimators (scikit-learn's shape).

- **Parallel**: every member ranks the GPUs of a prediction round; an alert needs all members to put the
  GPU in their top-K. The intersection is smaller than K: precision rises, recall falls.
- **Cascade**: a 1D-CNN filters out the instances it finds healthy (a score below what it gives all but the
  top ``keep`` share of healthy training instances); an MLP trained only on what passes the filter
  classifies the rest: it alerts above the score at which the newest part of its training window reached
  a target precision (0.5: "more likely failing than not"). The MLP specialises in the hard cases the
  filter could not clear.

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
        top = order[s : min(e, s + k)]
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

    def __init__(
        self,
        members: Sequence[str | FailureModel] = ("gbdt", "mlp", "cnn1d"),
        budget: float = DEFAULT_BUDGET,
        member_factor: float = 1.0,
        seed: int = 0,
    ) -> None:
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

    def __init__(
        self,
        filter: str | FailureModel = "cnn1d",
        classifier: str | FailureModel = "mlp",
        keep: float = 0.03,
        target_precision: float | None = 0.5,
        holdout: float = 0.2,
        negative_rate: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.filter = make_model(filter, seed=seed) if isinstance(filter, str) else filter
        self.classifier = make_model(classifier, seed=seed) if isinstance(classifier, str) else classifier
        if not 0 < keep < 1:
            raise ValueError(f"cascade keep={keep} must be a share in (0, 1)")
        if target_precision is not None and not 0 < target_precision < 1:
            raise ValueError(f"cascade target_precision={target_precision} must be in (0, 1) or None")
        self.keep = keep
        #: the classifier *classifies* (the paper's cascade): it alerts only above the score at which the
        #: newest ``holdout`` share of the training window reached ``target_precision``; None ranks instead
        self.target_precision = target_precision
        self.holdout = holdout
        #: the share of healthy instances kept in training samples: held-out negatives count 1/negative_rate
        #: times when precision is estimated, as they would in the field
        self.negative_rate = negative_rate
        self.cutoff: float | None = None
        self.threshold = -np.inf
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
        chosen = samples.take(np.flatnonzero(passed))
        self.threshold = -np.inf
        if self.target_precision is None:
            self.classifier.fit(chosen)
            return self
        # fit on the older part, pick the operating point on the newest part (never on what it was fit on)
        split = np.quantile(chosen.time, 1 - self.holdout)
        old, new = chosen.time < split, chosen.time >= split
        if chosen.y[old].sum() == 0 or chosen.y[new].sum() < 3:  # too few failures to choose: rank instead
            self.classifier.fit(chosen)
            return self
        self.classifier.fit(chosen.take(np.flatnonzero(old)))
        held = chosen.take(np.flatnonzero(new))
        self.threshold = operating_point(
            self.classifier.score(held), held.y, self.target_precision, negative_weight=1.0 / self.negative_rate
        )
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
            scores = np.asarray(self.classifier.score(samples.take(passed)), dtype=np.float64)
            out[passed] = np.where(scores >= self.threshold, scores, -np.inf)
        return out


def operating_point(scores: np.ndarray, y: np.ndarray, target: float, negative_weight: float = 1.0) -> float:
    """The lowest score threshold whose alerts (scores at or above it) reach ``target`` precision, with each
    negative counted ``negative_weight`` times (undoing negative sampling). When no threshold reaches the
    target, the one with the best precision over at least three right alerts; +inf if there is none."""
    order = np.argsort(-scores, kind="stable")
    s, right = scores[order], y[order].astype(np.float64)
    tp = np.cumsum(right)
    fp = np.cumsum((1 - right) * negative_weight)
    # thresholds sit where the next score differs, so tied scores are alerted together
    last = np.r_[s[1:] != s[:-1], True]
    precision = np.where(last, tp / np.maximum(tp + fp, 1e-12), -1.0)
    ok = np.flatnonzero((precision >= target) & (tp >= 3))
    if len(ok):
        return float(s[ok[-1]])
    usable = np.flatnonzero((tp >= 3) & last)
    if len(usable) == 0:
        return float("inf")
    return float(s[usable[np.argmax(precision[usable])]])
