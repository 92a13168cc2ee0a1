"""Straggler detection: the timings reader, NVRx-style scores, change points, and validation on Alibaba PAI jobs.

The real-data tests read the samples shipped in ``gpufleet/data/stragglers``; the start steps they check were
found by reading the per-worker tables by eye (see docs/diagnose_stragglers.md), not by running the detector.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpufleet
from gpufleet.data import straggler_sample_path
from gpufleet.diagnose.changepoint import Segment, bic_penalty, robust_sigma, segment_levels
from gpufleet.diagnose.stragglers import StragglerReport, detect_stragglers, parse_columns, read_timings
from gpufleet.errors import ConfigError, DiagnoseError


def _frame(M: np.ndarray, section: str = "step", first_step: int = 0) -> pl.DataFrame:
    """Long timings frame from a ranks x steps matrix of durations."""
    R, S = M.shape
    return pl.DataFrame(
        {
            "rank": np.repeat(np.arange(R), S),
            "step": np.tile(np.arange(first_step, first_step + S), R),
            "section": section,
            "duration_s": M.ravel(),
        }
    )


def _noisy(R: int = 16, S: int = 200, cv: float = 0.03, seed: int = 0) -> np.ndarray:
    """Durations around 0.1 s with multiplicative noise, identical in distribution on every rank."""
    return 0.1 * np.random.default_rng(seed).lognormal(0.0, cv, (R, S))


def _row(rep: StragglerReport, rank: int, section: str = "step") -> dict:
    return rep.ranks.filter((pl.col("rank") == rank) & (pl.col("section") == section)).to_dicts()[0]


def _stragglers(rep: StragglerReport, section: str = "step") -> set[int]:
    return set(rep.stragglers.filter(pl.col("section") == section)["rank"].to_list())


# --------------------------------------------------------------------------------------------------- reader


def test_reads_alibaba_layout_by_alias(tmp_path: Path) -> None:
    p = tmp_path / "job.csv"
    p.write_text(",worker,gpu,time,batch_time_norm\n0,0,25,1,476\n1,1,25,1,509\n2,0,25,11,480\n3,1,25,11,500\n")
    df = read_timings(p)
    assert df.columns == ["rank", "step", "section", "duration_s"]
    assert df.schema["rank"] == pl.Int64 and df.schema["step"] == pl.Int64 and df.schema["duration_s"] == pl.Float64
    assert df["section"].unique().to_list() == ["step"]
    assert df.filter((pl.col("rank") == 1) & (pl.col("step") == 11))["duration_s"].item() == 500.0


def test_explicit_mapping_and_ms_conversion(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("host,it,phase,lat\n3,7,fwd,250\n3,8,fwd,260\n")
    df = read_timings(p, parse_columns("rank=host, step=it, section=phase, duration_ms=lat"))
    assert df["duration_s"].to_list() == pytest.approx([0.25, 0.26])
    assert df["section"].to_list() == ["fwd", "fwd"]
    assert read_timings(p, {"rank": "host", "step": "it", "duration_ms": "lat"})["section"][0] == "fwd"  # alias


def test_alias_with_ms_suffix(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("rank,iteration,step_time_ms\n0,1,100\n1,1,120\n")
    assert read_timings(p)["duration_s"].to_list() == pytest.approx([0.1, 0.12])


def test_reads_parquet(tmp_path: Path) -> None:
    p = tmp_path / "t.parquet"
    pl.DataFrame(
        {"rank": [0, 1], "step": [5, 5], "section": ["forward", "forward"], "duration_s": [0.1, 0.2]}
    ).write_parquet(p)
    df = read_timings(p)
    assert df.height == 2 and df["section"].to_list() == ["forward", "forward"]


def test_wide_monitor_format_is_melted(tmp_path: Path) -> None:
    # what gpufleet.diagnose.monitor writes: rank, step, one column per section, total (seconds, may be empty)
    p = tmp_path / "wide.csv"
    p.write_text(
        "rank,step,data,forward,backward,optimizer,comm,total\n"
        "0,1,0.01,0.05,0.10,0.02,0.03,0.21\n"
        "1,1,0.01,0.06,,0.02,0.02,0.21\n"
    )
    df = read_timings(p)
    assert set(df["section"].unique()) == {"data", "forward", "backward", "optimizer", "comm", "total"}
    assert df.height == 11  # the empty backward cell is dropped
    assert df.filter((pl.col("rank") == 1) & (pl.col("section") == "forward"))["duration_s"].item() == 0.06


def test_wide_with_listed_sections_and_unit_suffix(tmp_path: Path) -> None:
    p = tmp_path / "wide.csv"
    p.write_text("worker,iter,fwd_ms,bwd_ms,loss\n0,1,50,100,2.3\n1,1,60,110,2.4\n")
    df = read_timings(p, parse_columns("sections=fwd_ms+bwd_ms"))
    assert set(df["section"].unique()) == {"fwd", "bwd"}
    assert df.filter((pl.col("rank") == 1) & (pl.col("section") == "bwd"))["duration_s"].item() == pytest.approx(0.11)


def test_missing_columns_error_names_file_columns_and_fix(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("host,when,value\na,1,2\n")
    with pytest.raises(DiagnoseError) as err:
        read_timings(p)
    msg = str(err.value)
    assert "bad.csv" in msg and "rank" in msg and "['host', 'when', 'value']" in msg and "--columns" in msg


def test_mapping_to_absent_column(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("rank,step,duration\n0,1,0.1\n")
    with pytest.raises(DiagnoseError, match=r"t\.csv.*--columns duration=batch.*columns found"):
        read_timings(p, {"duration": "batch"})


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("rank,step,duration\nx,1,0.1\n", "column 'rank'.*non-integer"),
        ("rank,step,duration\n0,1.5,0.1\n", "column 'step'.*non-integer"),
        ("rank,step,duration\n0,1,fast\n", "duration column 'duration'.*non-numbers"),
        ("rank,step,duration\n0,1,-0.1\n", "negative duration"),
        ("rank,step,section\n0,1,fwd\n", "no duration column"),
    ],
)
def test_bad_values_raise(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(DiagnoseError, match=match):
        read_timings(p)


def test_missing_file_and_bad_parquet(tmp_path: Path) -> None:
    with pytest.raises(DiagnoseError, match="no such file"):
        read_timings(tmp_path / "nope.csv")
    p = tmp_path / "t.parquet"
    p.write_text("not parquet")
    with pytest.raises(DiagnoseError, match="cannot be read as Parquet"):
        read_timings(p)


def test_parse_columns_errors() -> None:
    assert parse_columns(None) is None and parse_columns("  ") is None
    assert parse_columns("rank=worker,step=time,duration=batch_time_norm") == {
        "rank": "worker",
        "step": "time",
        "duration": "batch_time_norm",
    }
    with pytest.raises(DiagnoseError, match="malformed pair 'rank'"):
        parse_columns("rank")
    with pytest.raises(DiagnoseError, match="unknown key 'gpu'"):
        parse_columns("gpu=x")


# ------------------------------------------------------------------------------------------ change points


def test_segment_levels_finds_a_step_and_ignores_spikes() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 0.02, 300)
    x[120:200] += 0.4
    x[[30, 31, 250]] += 3.0  # spikes: removed by the running median, never a segment
    segs = segment_levels(x, min_size=5)
    assert [(s.start, s.end) for s in segs] == [(0, 120), (120, 200), (200, 300)]
    assert segs[1].level == pytest.approx(0.4, abs=0.02)


def test_segment_levels_on_noise_and_constants() -> None:
    assert segment_levels(np.random.default_rng(0).normal(0, 1, 500)) == [Segment(0, 500, pytest.approx(0, abs=0.2))]
    assert segment_levels(np.zeros(50)) == [Segment(0, 50, 0.0)]
    assert segment_levels(np.array([])) == []
    assert len(segment_levels(np.r_[np.zeros(10), np.ones(10)], min_size=5)) == 2
    with pytest.raises(ValueError):
        segment_levels(np.array([1.0, np.nan]))


def test_long_series_are_blocked_but_still_cut_near_the_step() -> None:
    x = np.random.default_rng(1).normal(0.0, 0.05, 10_000)
    x[6001:] += 0.5
    segs = segment_levels(x, max_points=1000)
    assert len(segs) == 2 and abs(segs[1].start - 6001) <= 10


def test_penalty_grows_with_sample_and_hold() -> None:
    x = np.random.default_rng(2).normal(0.0, 1.0, 4000)
    held = np.repeat(x[:2000], 2)  # every value logged twice, as in the Alibaba files
    assert robust_sigma(x) == pytest.approx(1.0, rel=0.2)
    assert robust_sigma(x, block=6) == pytest.approx(1.0, rel=0.25)
    assert robust_sigma(held, block=6) == pytest.approx(math.sqrt(2.0), rel=0.25)  # long-run sigma of held pairs
    assert bic_penalty(held, block=6) > 1.5 * bic_penalty(x, block=6)
    shifted = x.copy()
    shifted[2000:] += 10.0  # a level shift does not inflate the noise estimate
    assert robust_sigma(shifted, block=6) == pytest.approx(robust_sigma(x, block=6), rel=0.2)


# --------------------------------------------------------------------------------------------- synthetic


def test_no_straggler_in_uniform_noise() -> None:
    rep = detect_stragglers(_frame(_noisy()))
    assert rep.stragglers.height == 0
    assert rep.ranks["relative_score"].min() > 0.9
    assert rep.ranks.height == 16 and rep.windows.height == 16 * 20


def test_rank_slowed_from_step_50_is_found_with_its_start() -> None:
    M = _noisy()
    M[5, 50:] *= 1.5
    rep = detect_stragglers(_frame(M))
    assert _stragglers(rep) == {5}
    row = _row(rep, 5)
    assert abs(row["first_slow_step"] - 50) <= 2
    assert row["recovered_step"] is None
    assert row["self_slowdown"] == pytest.approx(1.5, rel=0.05)
    assert row["slowdown"] == pytest.approx(1.5, rel=0.1)
    assert row["individual_score"] == pytest.approx(1 / 1.5, rel=0.05)
    slow = rep.segments.filter((pl.col("rank") == 5) & pl.col("slow"))
    assert slow.height == 1 and abs(slow["start_step"].item() - 50) <= 2


def test_slowdown_that_recovers_has_an_end() -> None:
    M = _noisy(S=300)
    M[2, 100:160] *= 1.4
    row = _row(detect_stragglers(_frame(M, first_step=1000)), 2)
    assert row["is_straggler"]
    assert abs(row["first_slow_step"] - 1100) <= 2 and abs(row["recovered_step"] - 1160) <= 2
    assert row["episodes"] == 1


def test_rank_slow_from_the_start() -> None:
    M = _noisy()
    M[9] *= 1.6
    rep = detect_stragglers(_frame(M))
    row = _row(rep, 9)
    assert _stragglers(rep) == {9}
    assert row["first_slow_step"] == 0 and row["recovered_step"] is None
    assert row["relative_score"] == pytest.approx(1 / 1.6, rel=0.05)
    assert row["z"] > 10


def test_fleet_wide_slowdown_is_not_a_straggler() -> None:
    M = _noisy()
    M[:, 80:] *= 1.5  # e.g. a checkpoint phase or a slower data shard for everybody
    assert detect_stragglers(_frame(M)).stragglers.height == 0


def test_many_ranks_slowing_together_are_all_found() -> None:
    M = _noisy(R=10)
    M[6:, 150:] *= 1.3  # 4 of 10 ranks, as in Alibaba job 3: the per-step median would move, the quartile not
    rep = detect_stragglers(_frame(M))
    assert _stragglers(rep) == {6, 7, 8, 9}
    assert all(abs(_row(rep, r)["first_slow_step"] - 150) <= 3 for r in (6, 7, 8, 9))


def test_sections_are_scored_separately_and_comm_gets_a_note() -> None:
    M = _noisy(R=8, S=120)
    fwd = M.copy()
    fwd[3] *= 2.0
    frame = pl.concat([_frame(fwd, "forward"), _frame(M, "backward"), _frame(M * 0.3, "comm")])
    rep = detect_stragglers(frame)
    assert _stragglers(rep, "forward") == {3}
    assert _stragglers(rep, "backward") == set() and _stragglers(rep, "comm") == set()
    assert any("comm" in n and "blocking collective" in n for n in rep.notes)


def test_missing_steps_and_duplicate_rows() -> None:
    M = _noisy(R=8, S=120)
    M[1, 60:] *= 1.6
    frame = _frame(M).filter(~((pl.col("rank") == 4) & (pl.col("step") % 3 == 0)))
    halves = frame.with_columns(pl.col("duration_s") / 2)
    rep = detect_stragglers(pl.concat([halves, halves]))  # two rows per (rank, step) are summed
    assert _stragglers(rep) == {1}
    assert abs(_row(rep, 1)["first_slow_step"] - 60) <= 2
    assert _row(rep, 4)["n_steps"] == 80


def test_report_to_dict_is_json_ready() -> None:
    M = _noisy(R=4, S=60)
    M[0, 30:] *= 2
    d = detect_stragglers(_frame(M)).to_dict()
    text = json.dumps(d, allow_nan=False)
    assert d["stragglers"] == [{"section": "step", "rank": 0}]
    assert {"params", "ranks", "segments", "windows", "notes"} <= set(d)
    assert "windows" not in detect_stragglers(_frame(M)).to_dict(windows=False)
    assert "NaN" not in text


def test_single_rank_and_bad_arguments() -> None:
    rep = detect_stragglers(_frame(_noisy(R=1, S=30)))
    assert rep.stragglers.height == 0 and any("one rank" in n for n in rep.notes)
    frame = _frame(_noisy(R=2, S=30))
    for kwargs in (
        {"threshold": 0.0},
        {"threshold": 1.5},
        {"window": 0},
        {"min_slowdown": 1.0},
        {"reference_quantile": 2.0},
    ):
        with pytest.raises(DiagnoseError):
            detect_stragglers(frame, **kwargs)
    with pytest.raises(DiagnoseError, match="missing column"):
        detect_stragglers(frame.rename({"duration_s": "d"}))
    with pytest.raises(DiagnoseError, match="no rows"):
        detect_stragglers(frame.with_columns(pl.lit(0.0).alias("duration_s")))


def test_capped_changepoints_fall_back_to_windows() -> None:
    M = _noisy(R=12)
    M[[2, 5, 7], 100:] *= 1.6
    rep = detect_stragglers(_frame(M), max_changepoint_ranks=1)
    assert _stragglers(rep) == {2, 5, 7}
    assert any("change points ran on 1 of 3" in n for n in rep.notes)


def test_large_job_is_handled() -> None:
    # 300 ranks x 600 steps: the shape of the speed target (1000 x 2000 runs in about a second; see the docs)
    M = _noisy(R=300, S=600, cv=0.05, seed=7)
    M[17, 400:] *= 1.5
    M[250, 100:200] *= 1.4
    rep = detect_stragglers(_frame(M))
    assert _stragglers(rep) == {17, 250}
    assert abs(_row(rep, 17)["first_slow_step"] - 400) <= 3
    assert abs(_row(rep, 250)["first_slow_step"] - 100) <= 3 and abs(_row(rep, 250)["recovered_step"] - 200) <= 3
    assert rep.segments["rank"].n_unique() <= 10  # change points ran on a few ranks, not all


# --------------------------------------------------------------------------------------------- properties


durations = st.integers(min_value=0, max_value=2**31 - 1).map(
    lambda seed: 0.05 * np.random.default_rng(seed).lognormal(0.0, 0.1, (6, 40))
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(M=durations, slow_rank=st.integers(0, 5), factor=st.floats(1.0, 3.0))
def test_scores_are_in_zero_one(M: np.ndarray, slow_rank: int, factor: float) -> None:
    M = M.copy()
    M[slow_rank, 20:] *= factor
    rep = detect_stragglers(_frame(M), window=5)
    for frame in (rep.ranks, rep.windows, rep.segments):
        scores = frame["relative_score"].drop_nulls().drop_nans()
        assert ((scores > 0) & (scores <= 1)).all()
    for frame in (rep.ranks, rep.windows):
        ind = frame["individual_score"].drop_nulls().drop_nans()
        assert ((ind > 0) & (ind <= 1)).all()
    assert rep.ranks["relative_score"].max() == 1.0  # the fastest rank scores exactly 1


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(M=durations, slow_rank=st.integers(0, 5), power=st.integers(-12, 12))
def test_scaling_all_durations_changes_nothing(M: np.ndarray, slow_rank: int, power: int) -> None:
    M = M.copy()
    M[slow_rank, 15:] *= 1.7
    scale = 2.0**power  # exact in floating point, so every decision must be identical
    a, b = detect_stragglers(_frame(M)), detect_stragglers(_frame(M * scale))
    keep = [c for c in a.ranks.columns if c != "median_s"]
    assert a.ranks.select(keep).equals(b.ranks.select(keep))
    assert a.segments.equals(b.segments)
    assert np.allclose(b.ranks["median_s"].to_numpy(), a.ranks["median_s"].to_numpy() * scale)


def test_milliseconds_or_seconds_give_the_same_verdict() -> None:
    M = _noisy()
    M[3, 120:] *= 1.5
    a, b = detect_stragglers(_frame(M)), detect_stragglers(_frame(M * 1000.0))
    cols = ["rank", "is_straggler", "first_slow_step", "recovered_step"]
    assert a.ranks.select(cols).equals(b.ranks.select(cols))
    assert np.allclose(a.ranks["relative_score"].to_numpy(), b.ranks["relative_score"].to_numpy())


# ------------------------------------------------------------------------------------ Alibaba PAI (real)


def _job(n: int) -> StragglerReport:
    return detect_stragglers(read_timings(straggler_sample_path(n)))


def test_alibaba_reader_and_explicit_mapping_agree() -> None:
    path = straggler_sample_path(1)
    assert path.parent == Path(gpufleet.__file__).parent / "data" / "stragglers"  # shipped in the wheel
    with pytest.raises(ConfigError, match="shipped jobs: \\(1, 2, 3, 4\\)"):
        straggler_sample_path(5)
    auto = read_timings(path)
    explicit = read_timings(path, parse_columns("rank=worker,step=time,duration=batch_time_norm"))
    assert auto.equals(explicit)
    assert auto.height == 3000 and auto["rank"].n_unique() == 10 and auto["step"].n_unique() == 300


def test_alibaba_job1_worker6_emerges_mid_training() -> None:
    # By eye: worker 6 reads 413-430 up to step 1801, then 745, 745, 837, 851, 417, 1000, 551, 701, 549, 438,
    # 500, 500, 618, 566 at steps 1811-1941, and 388 at 1951 (the others stay at 380-503 throughout).
    rep = _job(1)
    row = _row(rep, 6)
    assert row["is_straggler"]
    assert abs(row["first_slow_step"] - 1811) <= 20
    assert abs(row["recovered_step"] - 1951) <= 20
    assert row["slowdown"] > 1.5
    assert row["relative_score"] > 0.95  # over the whole run worker 6 looks normal: only the windows show it
    assert row["worst_window_score"] < 0.75
    # worker 4 has a short bump: 584, 584, 574, 574 at steps 131-161 (478 at 171) while workers 3, 7, 8, 9 stay
    # <= 455. Four samples (two distinct values) are shorter than the minimum episode (7 steps): a blip, seen in
    # the segments but not a straggler. Workers 0-2 are ~10% slower throughout, far from the 0.75 threshold.
    assert _stragglers(rep) == {6}
    bump = rep.segments.filter((pl.col("rank") == 4) & (pl.col("ratio") > 1.25))
    assert bump.height == 1 and abs(bump["start_step"].item() - 131) <= 10 and not bump["slow"].item()


def test_alibaba_job2_stable_heterogeneity_has_no_straggler() -> None:
    rep = _job(2)
    assert rep.stragglers.height == 0
    # worker 5 is ~1.32x the fastest worker (1) all along: close to, but not below, the 0.75 threshold
    assert _row(rep, 5)["relative_score"] == pytest.approx(0.757, abs=0.01)


def test_alibaba_job3_four_workers_slow_down_near_the_end() -> None:
    # By eye: workers 6-9 run at 670-760 until ~2150, then climb to 830-1000 (6 and 7 from 2161-2171,
    # 8 from 2181, 9 from 2191, all fully slow by ~2300); workers 0-5 stay where they were.
    rep = _job(3)
    assert _stragglers(rep) == {6, 7, 8, 9}
    firsts = {r: _row(rep, r)["first_slow_step"] for r in (6, 7, 8, 9)}
    assert all(2141 <= s <= 2311 for s in firsts.values()), firsts
    assert abs(firsts[6] - 2171) <= 20 and abs(firsts[7] - 2161) <= 20 and abs(firsts[8] - 2181) <= 20
    assert all(_row(rep, r)["recovered_step"] is None for r in (6, 7, 8, 9))
    assert all(1.15 < _row(rep, r)["self_slowdown"] < 1.45 for r in (6, 7, 8, 9))


def test_alibaba_job4_persistent_and_escalating_stragglers() -> None:
    # By eye: workers 0, 5, 6, 7, 8 run at 180-300 against 56-68 for 1, 2, 3, 4, 9 the whole job; worker 4 starts
    # at ~120 and drops to 57 at step 1021-1031; workers 5 and 6 jump to 870-980 at 18711-18741.
    rep = _job(4)
    found = _stragglers(rep)
    assert {0, 5, 6, 7, 8, 4} <= found
    assert {1, 2}.isdisjoint(found)
    for r in (0, 5, 6, 7, 8):
        assert _row(rep, r)["relative_score"] < 0.35
    assert _row(rep, 4)["first_slow_step"] == 1 and abs(_row(rep, 4)["recovered_step"] - 1021) <= 20
    for r, jump in ((5, 18721), (6, 18741)):
        row = _row(rep, r)
        assert abs(row["worst_step"] - jump) <= 20 and row["slowdown"] > 10
