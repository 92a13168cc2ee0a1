"""The planner-vs-published table names where the planner's best layout gains: the reason for an exception."""

from __future__ import annotations

from gpufleet.perf.ground_truth import read_cases
from gpufleet.perf.planner_check import gap_gains, planner_gaps
from gpufleet.perf.step import BREAKDOWN_KEYS


def _parts(**seconds: float) -> dict[str, float]:
    return {k: seconds.get(k, 0.0) for k in BREAKDOWN_KEYS}


def test_gap_gains_names_the_largest_savings_recompute_and_memory():
    published = _parts(compute=10.0, tp_comm=2.0, pp_bubble=1.0, ep_comm=0.5)
    best = _parts(compute=7.0, tp_comm=1.5, pp_bubble=1.2, ep_comm=0.5)
    text = gap_gains(published, best, "full", "none", (91.0, 80.0))
    assert text.startswith("compute (incl. recompute) -3.00 s; tp_comm -0.50 s")
    assert "pp_bubble" not in text and "ep_comm" not in text  # no saving there (the best loses in pp_bubble)
    assert "recompute full -> none" in text
    assert "published layout over memory (91 of 80 GiB)" in text
    assert gap_gains(published, published, "none", "none", (50.0, 80.0)) == "nothing: same time"


def test_every_planned_run_says_where_the_planner_gains():
    cases, _ = read_cases()
    by_row = {c.row: c for c in cases}
    picked = [by_row[4], by_row[13]]  # Narayanan 2021's 76B (full recompute) and MegaScale's 12,288-GPU run
    gaps = planner_gaps(picked)
    narayanan = gaps.filter(gaps["row"] == 4).row(0, named=True)
    assert not narayanan["trusted"]
    assert "recompute full -> none" in narayanan["gains"]
    assert narayanan["gains"].startswith("compute")  # what dropping the recomputation saves comes first
    assert gaps["gains"].str.len_chars().min() > 0
