"""write_trace round trips (Parquet keeps the origin) and trace_info's numbers."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from gpufleet.errors import TraceError
from gpufleet.traces import JOB_SCHEMA, ORIGIN_KEY, load_trace, trace_info, write_trace
from gpufleet.traces.info import gpus_for_load
from gpufleet.traces.synthetic import PHILLY_GPU_MIX


def test_parquet_round_trip_is_identical(philly_load, tmp_path: Path) -> None:
    path = write_trace(philly_load.jobs, tmp_path / "philly.parquet", "parquet", origin=philly_load.origin)
    schema = pq.read_schema(path)
    assert schema.metadata[ORIGIN_KEY.encode()] == b"2017-09-04T10:30:41"
    assert [schema.field(n) for n in JOB_SCHEMA.names] == list(JOB_SCHEMA)
    again = load_trace(path)
    assert again.reader == "parquet"
    assert again.origin == philly_load.origin == datetime(2017, 9, 4, 10, 30, 41)
    assert again.rejected == {} and again.rows_read == 82_247
    assert_frame_equal(again.jobs, philly_load.jobs)


def test_trace_load_carries_its_origin(philly_load, tmp_path: Path) -> None:
    again = load_trace(write_trace(philly_load, tmp_path / "p.parquet"))
    assert again.origin == philly_load.origin


def test_parquet_without_origin(tmp_path: Path) -> None:
    jobs = load_trace(write_trace(_small(), tmp_path / "s.parquet")).jobs
    assert_frame_equal(jobs, _small())
    assert load_trace(tmp_path / "s.parquet").origin is None


def test_parquet_vc_filter(philly_load, tmp_path: Path) -> None:
    path = write_trace(philly_load, tmp_path / "p.parquet")
    assert load_trace(path, vc="11cb48").jobs.height == 16_091


def test_csv_round_trip_keeps_canonical_columns(philly_load, tmp_path: Path) -> None:
    path = write_trace(philly_load, tmp_path / "p.csv")
    header = path.read_text().splitlines()[0]
    assert header == "job_id,submit_s,duration_s,num_gpus,gpu_type,user,vc,kind"
    again = load_trace(path)
    assert again.origin is None  # CSV has no place for it
    assert_frame_equal(again.jobs, philly_load.jobs.drop("gpu_time"))


def test_write_rejects_non_traces(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"canonical columns.*num_gpus"):
        write_trace(pl.DataFrame({"job_id": ["a"]}), tmp_path / "x.parquet")
    with pytest.raises(TraceError, match="no nulls"):
        write_trace(_small().with_columns(pl.lit(None, pl.String).alias("job_id")), tmp_path / "x.parquet")
    with pytest.raises(TraceError, match="suffix"):
        write_trace(_small(), tmp_path / "x.json")
    with pytest.raises(TraceError, match="unknown trace format 'json'"):
        write_trace(_small(), tmp_path / "x.parquet", "json")


def _small() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "job_id": ["a", "b", "c"],
            "submit_s": [0.0, 1800.0, 3600.0],
            "duration_s": [3600.0, 7200.0, 60.0],
            "num_gpus": [1, 4, 1],
            "gpu_type": [None, "a100", None],
            "user": ["u1", None, "u1"],
            "vc": ["x", "x", None],
            "kind": ["train", "inference", "train"],
        },
        schema_overrides={"num_gpus": pl.Int32},
    )


def test_info_small_trace(tmp_path: Path) -> None:
    load = load_trace(write_trace(_small(), tmp_path / "s.parquet", origin=datetime(2024, 1, 1)))
    info = trace_info(load)
    assert info["jobs"] == 3 and info["rows_read"] == 3 and info["rejected_total"] == 0
    assert info["span_s"] == 3600.0 and info["span_days"] == pytest.approx(1 / 24)
    assert info["first_submit"] == "2024-01-01T00:00:00" and info["last_submit"] == "2024-01-01T01:00:00"
    assert info["jobs_by_gpus"] == {1: 2, 4: 1}
    gpu_s = 3600 + 4 * 7200 + 60
    assert info["gpu_time_share_by_gpus"] == pytest.approx({1: 3660 / gpu_s, 4: 28800 / gpu_s})
    assert info["gpu_hours"] == pytest.approx(gpu_s / 3600)
    assert info["avg_busy_gpus"] == pytest.approx(gpu_s / 3600)  # span is one hour
    assert info["duration_s"]["p50"] == 3600.0 and info["duration_s"]["max"] == 7200.0
    assert info["jobs_by_vc"] == {"x": 2, None: 1}
    assert info["jobs_by_kind"] == {"inference": 1, "train": 2}


def test_info_philly(philly_load) -> None:
    info = trace_info(philly_load)
    assert info["jobs"] == 82_247 and info["rejected"] == {}
    assert info["origin"] == "2017-09-04T10:30:41"
    assert info["last_submit"] == "2017-12-22T08:02:11"
    assert info["span_days"] == pytest.approx(108.896875)
    assert info["jobs_by_gpus"] == PHILLY_GPU_MIX
    assert sum(info["gpu_time_share_by_gpus"].values()) == pytest.approx(1.0)
    assert info["duration_s"]["p50"] == 1144.0 and info["duration_s"]["max"] == 4_628_226.0
    assert info["avg_busy_gpus"] == pytest.approx(info["gpu_hours"] * 3600 / info["span_s"])
    assert info["jobs_by_vc"]["6214e9"] == 41_226 and len(info["jobs_by_vc"]) == 15


def test_info_empty_trace(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("submit_s,duration_s,num_gpus\n1,-1,1\n")
    info = trace_info(load_trace(path))
    assert info["jobs"] == 0 and info["rejected"] == {"duration_s <= 0": 1} and info["span_s"] == 0.0


def _jobs(submit: list[float], duration: list[float], gpus: list[int]) -> pl.DataFrame:
    return pl.DataFrame({"submit_s": submit, "duration_s": duration, "num_gpus": gpus})


def test_gpus_for_load_offers_the_load_in_whole_nodes() -> None:
    # 4 jobs over 1,000 s: 8 x 500 + 4 x 1,000 + 2 x 250 + 1 x 2,000 = 10,500 GPU-s, 10.5 busy GPUs on average
    jobs = _jobs([0, 250, 500, 1000], [500, 1000, 250, 2000], [8, 4, 2, 1])
    assert gpus_for_load(jobs, 1.0) == 11
    assert gpus_for_load(jobs, 0.5) == 21
    assert gpus_for_load(jobs, 0.9, gpus_per_node=8) == 16  # 11.67 -> two nodes
    assert gpus_for_load(jobs, 2.0) == 8  # overloaded, but never below the largest job


def test_gpus_for_load_is_the_smallest_size_at_or_under_the_load(philly_load) -> None:
    jobs = philly_load.jobs.sort("submit_s").slice(20_000, 2_000)
    work = float((jobs["duration_s"] * jobs["num_gpus"]).sum())
    span = float(jobs["submit_s"].max() - jobs["submit_s"].min())
    for load in (0.5, 0.9, 1.3):
        g = gpus_for_load(jobs, load, gpus_per_node=8)
        assert g % 8 == 0 and g >= jobs["num_gpus"].max()
        assert work / span / g <= load  # offered load at this size is at most the target ...
        assert g == 8 or work / span / (g - 8) > load  # ... and one node fewer would exceed it


@pytest.mark.parametrize(("load", "gpn", "frame"), [(0.0, 1, None), (-1.0, 1, None), (0.9, 0, None), (0.9, 1, "empty")])
def test_gpus_for_load_refuses_what_it_cannot_size(load, gpn, frame) -> None:
    jobs = _jobs([], [], []) if frame == "empty" else _jobs([0, 10], [5, 5], [1, 1])
    with pytest.raises(TraceError):
        gpus_for_load(jobs, load, gpus_per_node=gpn)
