"""breakdown(): per-VC and per-size statistics on a tiny hand-made job frame."""

from __future__ import annotations

import math

import polars as pl
import pytest

from gpufleet.report.breakdown import BREAKDOWN_COLUMNS, breakdown

NAN = float("nan")


@pytest.fixture
def jobs() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "job_id": ["j1", "j2", "j3", "j4", "j5", "j6"],
            "vc": ["a", "a", "b", "b", None, "a"],
            "num_gpus": [1, 2, 8, 16, 64, 4],
            "jct_s": [100.0, 300.0, NAN, 1000.0, 50.0, 200.0],  # j3 never finished
            "queue_s": [0.0, 50.0, NAN, 200.0, 10.0, 20.0],
        }
    )


def _rows(frame: pl.DataFrame) -> dict[str, dict]:
    return {row["group"]: row for row in frame.iter_rows(named=True)}


def test_breakdown_by_vc(jobs: pl.DataFrame) -> None:
    out = breakdown(jobs, "vc")
    assert tuple(out.columns) == BREAKDOWN_COLUMNS
    assert out["group"].to_list() == ["a", "b", "(none)"]
    rows = _rows(out)
    assert rows["a"]["jobs"] == 3
    assert rows["a"]["avg_jct_s"] == pytest.approx(200.0)
    assert rows["a"]["avg_queue_s"] == pytest.approx(70.0 / 3)
    assert rows["a"]["p95_jct_s"] == pytest.approx(290.0)  # linear between 200 and 300 at 0.9
    # The unfinished job counts as a job but not in the averages.
    assert rows["b"]["jobs"] == 2
    assert rows["b"]["avg_jct_s"] == pytest.approx(1000.0)
    assert rows["b"]["avg_queue_s"] == pytest.approx(200.0)
    assert rows["(none)"]["avg_jct_s"] == pytest.approx(50.0)


def test_breakdown_by_size(jobs: pl.DataFrame) -> None:
    out = breakdown(jobs, "size")
    assert out["group"].to_list() == ["1", "2-4", "5-8", "9-32", "33+"]
    rows = _rows(out)
    assert rows["1"]["jobs"] == 1 and rows["1"]["avg_jct_s"] == pytest.approx(100.0)
    assert rows["2-4"]["jobs"] == 2
    assert rows["2-4"]["avg_jct_s"] == pytest.approx(250.0)
    assert rows["2-4"]["avg_queue_s"] == pytest.approx(35.0)
    assert rows["2-4"]["p95_jct_s"] == pytest.approx(295.0)
    assert rows["5-8"]["jobs"] == 1 and rows["5-8"]["avg_jct_s"] is None  # only an unfinished job
    assert rows["9-32"]["avg_jct_s"] == pytest.approx(1000.0)
    assert rows["33+"]["avg_queue_s"] == pytest.approx(10.0)


def test_breakdown_size_bucket_edges() -> None:
    frame = pl.DataFrame({"num_gpus": [1, 2, 4, 5, 8, 9, 32, 33], "jct_s": [1.0] * 8, "queue_s": [0.0] * 8})
    out = breakdown(frame, "size")
    counts = dict(zip(out["group"], out["jobs"], strict=True))
    assert counts == {"1": 1, "2-4": 2, "5-8": 2, "9-32": 2, "33+": 1}


def test_breakdown_empty_and_all_null_vc() -> None:
    schema = {"vc": pl.String, "jct_s": pl.Float64, "queue_s": pl.Float64}
    empty = breakdown(pl.DataFrame(schema=schema), "vc")
    assert empty.height == 0 and tuple(empty.columns) == BREAKDOWN_COLUMNS
    frame = pl.DataFrame({"vc": [None, None], "jct_s": [1.0, 3.0], "queue_s": [0.0, 0.0]})
    out = breakdown(frame, "vc")
    assert out["group"].to_list() == ["(none)"]
    assert math.isclose(out["avg_jct_s"][0], 2.0)


def test_breakdown_rejects_bad_input(jobs: pl.DataFrame) -> None:
    with pytest.raises(ValueError, match="by must be"):
        breakdown(jobs, "user")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_gpus"):
        breakdown(jobs.drop("num_gpus"), "size")
