"""Top-K alerting and the two ensembles, with fake members that record what they see."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.health.models.ensembles import CascadeEnsemble, ParallelEnsemble, top_k_per_round
from gpufleet.health.samples import Samples


def _samples(tab: np.ndarray, time: np.ndarray | None = None, y: np.ndarray | None = None) -> Samples:
    n = len(tab)
    return Samples(
        gpu=np.arange(n, dtype=np.uint32),
        time=np.zeros(n, np.int64) if time is None else time,
        tabular=tab.astype(np.float32),
        sequence=np.zeros((n, 2, 1), np.float32),
        y=y,
    )


class Column:
    """A fake model: the score is one tabular column; it records every fit and score call."""

    name = "column"

    def __init__(self, col: int) -> None:
        self.col = col
        self.fitted_on: list[np.ndarray] = []
        self.scored: list[np.ndarray] = []

    def fit(self, samples: Samples) -> Column:
        self.fitted_on.append(samples.gpu.copy())
        return self

    def score(self, samples: Samples) -> np.ndarray:
        self.scored.append(samples.gpu.copy())
        return samples.tabular[:, self.col].astype(np.float64)


# -------------------------------------------------------------------------------------------- top-K
def test_top_k_ties_and_minus_inf():
    times = np.array([5, 5, 5, 5, 9, 9, 9, 2, 2])
    scores = np.array([0.5, 0.9, 0.9, 0.1, -np.inf, -np.inf, 0.3, -np.inf, -np.inf])
    # round 5: k = round(0.5 * 4) = 2 -> the two tied 0.9; round 9: k = 2 but one finite score;
    # round 2: nothing finite, nothing alerted
    assert top_k_per_round(times, scores, 0.5).tolist() == [False, True, True, False, False, False, True, False, False]
    # a tiny budget still alerts once per round (k = max(1, ...)); -inf rounds stay silent
    assert np.flatnonzero(top_k_per_round(times, scores, 1e-6)).tolist() in ([1, 6], [2, 6])
    # k cuts through a tie: exactly k of the tied instances
    hit = top_k_per_round(np.zeros(4, int), np.array([0.9, 0.9, 0.9, 0.1]), 0.5)
    assert hit.sum() == 2 and not hit[3]
    assert top_k_per_round(np.zeros(0, int), np.zeros(0), 0.5).tolist() == []
    assert top_k_per_round(np.zeros(3, int), np.array([1.0, 2.0, 3.0]), 1.0).all()


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.one_of(st.sampled_from([-np.inf, 0.0, 1.0]), st.floats(-5, 5))),
        min_size=1,
        max_size=40,
    ),
    st.floats(0.01, 1.0),
)
def test_top_k_matches_naive(rows, budget):
    times = np.array([r[0] for r in rows])
    scores = np.array([r[1] for r in rows])
    hit = top_k_per_round(times, scores, budget)
    for t in np.unique(times):
        idx = np.flatnonzero(times == t)
        k = max(1, round(budget * len(idx)))
        finite = idx[np.isfinite(scores[idx])]
        assert hit[idx].sum() == min(k, len(finite))
        assert not hit[idx[~np.isfinite(scores[idx])]].any()
        if hit[idx].any() and (~hit[finite]).any():
            assert scores[idx][hit[idx]].min() >= scores[finite][~hit[finite]].max()


# -------------------------------------------------------------------------------------------- parallel
def test_parallel_alerts_exactly_the_intersection():
    # each member's top-K is member_factor x budget: 3 x 0.1 x 10 instances = 3 per round
    # round 0: tops {0, 1, 2}, {1, 2, 5}, {2, 1, 9} -> {1, 2}; round 24: tops {10, 11, 12}, {13, 14, 15}, ... -> none
    a = np.r_[[9, 8, 7, 0, 0, 0, 0, 0, 0, 0], [9, 8, 7, 0, 0, 0, 0, 0, 0, 0]].astype(float)
    b = np.r_[[0, 8, 7, 0, 0, 9, 0, 0, 0, 0], [0, 0, 0, 9, 8, 7, 0, 0, 0, 0]].astype(float)
    c = np.r_[[0, 8, 9, 0, 0, 0, 0, 0, 0, 7], [9, 8, 7, 0, 0, 0, 0, 0, 0, 0]].astype(float)
    rng = np.random.default_rng(0)  # the zeros made distinct, below every top score
    a, b, c = (np.where(x == 0, rng.random(20), x) for x in (a, b, c))
    times = np.repeat([0, 24], 10)
    members = [Column(0), Column(1), Column(2)]
    ens = ParallelEnsemble(members, budget=0.1, member_factor=3.0)
    samples = _samples(np.stack([a, b, c], axis=1), times, y=np.zeros(20, np.int8))
    ens.fit(samples)
    assert all(len(m.fitted_on) == 1 for m in members)
    out = ens.score(samples)
    assert np.flatnonzero(np.isfinite(out)).tolist() == [1, 2]
    np.testing.assert_array_equal(ens.combine(times, [a, b, c]), out)
    # survivors are ordered by the members' mean rank percentile: 1 (ranks 9, 9, 9 of 10) above 2 (8, 8, 10)
    assert out[1] == pytest.approx(0.9) and out[2] == pytest.approx(26 / 30)
    # the ensemble's own budget (k = 1 a round) then alerts the best of the intersection, and nothing in round 24
    assert np.flatnonzero(top_k_per_round(times, out, ens.budget)).tolist() == [1]
    # with member K equal to the budget, the alerts are exactly the intersection of the members' top-K
    same = ParallelEnsemble(members, budget=0.3, member_factor=1.0)
    inter = np.logical_and.reduce([top_k_per_round(times, s, 0.3) for s in (a, b, c)])
    assert np.array_equal(top_k_per_round(times, same.combine(times, [a, b, c]), 0.3), inter)
    assert np.flatnonzero(inter).tolist() == [1, 2]


def test_parallel_needs_two_members():
    with pytest.raises(ValueError, match="at least two"):
        ParallelEnsemble([Column(0)])


# -------------------------------------------------------------------------------------------- cascade
def _cascade_data(pos_filter: np.ndarray) -> Samples:
    neg = np.arange(190, dtype=float)  # the filter's scores of the healthy instances: 0..189
    f = np.r_[neg, pos_filter]
    y = np.r_[np.zeros(190, np.int8), np.ones(len(pos_filter), np.int8)]
    cls = np.arange(len(f), dtype=float)[::-1]
    return _samples(np.stack([f, cls], axis=1), y=y)


def test_cascade_fits_classifier_on_what_passes_the_filter():
    data = _cascade_data(np.array([300, 301, 302, 303, 304, -1, -2, -3, -4, -5], dtype=float))
    filt, clf = Column(0), Column(1)
    casc = CascadeEnsemble(filter=filt, classifier=clf, keep=0.1).fit(data)
    # cut: the 90 % quantile of healthy scores 0..189 = 0.9 x 189 = 170.1 -> healthy 171..189 pass (19)
    assert casc.cutoff == pytest.approx(170.1)
    want = set(range(171, 190)) | {190, 191, 192, 193, 194}
    assert len(filt.fitted_on) == 1 and len(clf.fitted_on) == 1
    assert set(clf.fitted_on[0].tolist()) == want
    out = casc.score(data)
    passed = np.array(sorted(want))
    assert np.isneginf(np.delete(out, passed)).all()
    np.testing.assert_array_equal(out[passed], data.tabular[passed, 1])
    # the classifier only scores what passed
    assert set(clf.scored[-1].tolist()) == want


def test_cascade_without_a_passing_positive_trains_on_all_positives():
    data = _cascade_data(np.array([-1, -2, 50], dtype=float))
    clf = Column(1)
    casc = CascadeEnsemble(filter=Column(0), classifier=clf, keep=0.1).fit(data)
    # no positive above the cut: the cut falls to the lowest positive's score (-2), so everything passes
    assert set(clf.fitted_on[0].tolist()) == set(range(193))
    assert casc.cutoff == pytest.approx(170.1)


def test_cascade_reuses_a_fitted_filter_and_checks_arguments():
    data = _cascade_data(np.array([300, 301], dtype=float))
    filt = Column(0)
    casc = CascadeEnsemble(filter=Column(0), classifier=Column(1), keep=0.1).with_fitted_filter(filt).fit(data)
    assert filt.fitted_on == [] and len(filt.scored) == 1 and casc.filter is filt
    with pytest.raises(ValueError, match="before fit"):
        CascadeEnsemble(filter=Column(0), classifier=Column(1)).score(data)
    with pytest.raises(ValueError, match="keep"):
        CascadeEnsemble(filter=Column(0), classifier=Column(1), keep=1.0)
    with pytest.raises(ValueError, match="labelled"):
        CascadeEnsemble(filter=Column(0), classifier=Column(1)).fit(_samples(np.zeros((3, 2))))


# -------------------------------------------------------------------------------------------- operating point
def test_operating_point_is_the_lowest_threshold_reaching_the_target():
    from gpufleet.health.models.ensembles import operating_point

    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    y = np.array([1, 1, 0, 1, 0])
    # alerts at or above: 5 -> 1/1, 4 -> 2/2, 3 -> 2/3, 2 -> 3/4, 1 -> 3/5 (three right alerts needed)
    assert operating_point(scores, y, 0.6) == 1.0
    assert operating_point(scores, y, 0.7) == 2.0
    # negatives counted twice (sampled at 50 %): 2 -> 3/5, 1 -> 3/7
    assert operating_point(scores, y, 0.6, negative_weight=2.0) == 2.0
    # unreachable target: the best precision with three right alerts (3/4 at 2.0)
    assert operating_point(scores, y, 0.9) == 2.0
    # fewer than three right alerts: nothing qualifies
    assert operating_point(scores, np.array([1, 0, 0, 0, 1]), 0.5) == float("inf")
    # tied scores are alerted together: the threshold never splits a tie
    tied = np.array([3.0, 3.0, 3.0, 3.0, 1.0])
    # (3/4 at 3.0 and 3/5 at 1.0: 0.8 is out of reach, so the best, 3.0; 0.7 is reached at 3.0 only)
    assert operating_point(tied, np.array([1, 1, 1, 0, 0]), 0.8) == 3.0
    assert operating_point(tied, np.array([1, 1, 1, 0, 0]), 0.7) == 3.0
    assert operating_point(tied, np.array([1, 1, 1, 0, 0]), 0.6) == 1.0


def test_cascade_classifies_above_the_operating_point_of_its_newest_data():
    # 400 instances over times 0..399; the filter passes everything with column 0 >= 0; the classifier's
    # score (column 1) is right above 10 on the newest fifth, where the operating point is chosen
    rng = np.random.default_rng(0)
    n = 400
    time = np.arange(n, dtype=np.int64)
    clf_score = rng.uniform(0, 20, n).astype(np.float32).astype(np.float64)  # what the fake returns
    y = (clf_score > 10).astype(np.int8)
    y[rng.choice(n, 40, replace=False)] ^= 1  # some label noise
    tab = np.stack([np.ones(n), clf_score], axis=1)
    data = _samples(tab, time=time, y=y)
    filt, clf = Column(0), Column(1)
    casc = CascadeEnsemble(filter=filt, classifier=clf, keep=0.5, target_precision=0.8).fit(data)
    # fit on the older 80 % only, the threshold from the newest 20 %
    assert set(clf.fitted_on[0].tolist()) == set(np.flatnonzero(time < np.quantile(time, 0.8)).tolist())
    new = time >= np.quantile(time, 0.8)
    s, yy = clf_score[new], y[new]
    order = np.argsort(-s)
    prec = np.cumsum(yy[order]) / np.arange(1, len(order) + 1)
    lowest_ok = s[order][np.flatnonzero((prec >= 0.8) & (np.cumsum(yy[order]) >= 3))[-1]]
    assert casc.threshold == pytest.approx(lowest_ok)
    out = casc.score(data)
    assert np.all(np.isneginf(out[clf_score < casc.threshold]))
    np.testing.assert_array_equal(out[clf_score >= casc.threshold], clf_score[clf_score >= casc.threshold])
    # ranking instead of classifying when asked
    ranked = CascadeEnsemble(filter=Column(0), classifier=Column(1), keep=0.5, target_precision=None).fit(data)
    assert ranked.threshold == -np.inf and np.isfinite(ranked.score(data)).all()
