"""The real Philly trace: row counts, virtual clusters, span, first row, bundled copy, vc filter."""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import gpufleet
from gpufleet.errors import TraceError
from gpufleet.traces import CANONICAL_COLUMNS, POLARS_SCHEMA, bundled_trace_path, load_trace

ORIGIN = datetime(2017, 9, 4, 10, 30, 41)


def test_unpacked_philly_is_the_published_file(published_philly: Path, philly_md5: str) -> None:
    assert hashlib.md5(published_philly.read_bytes()).hexdigest() == philly_md5


def test_philly_loads_every_job(philly_load) -> None:
    assert philly_load.reader == "philly"  # picked from the header, not named
    assert philly_load.rows_read == 82_247
    assert philly_load.jobs.height == 82_247
    assert philly_load.rejected == {}
    assert philly_load.origin == ORIGIN


def test_philly_schema_is_canonical_then_extras(philly_load) -> None:
    jobs = philly_load.jobs
    assert tuple(jobs.columns[: len(CANONICAL_COLUMNS)]) == CANONICAL_COLUMNS
    assert jobs.columns[len(CANONICAL_COLUMNS) :] == ["gpu_time"]
    assert {c: jobs.schema[c] for c in CANONICAL_COLUMNS} == POLARS_SCHEMA
    assert jobs.schema["gpu_time"] == pl.Float64


def test_philly_vcs_and_span(philly_load) -> None:
    jobs = philly_load.jobs
    counts = dict(jobs.group_by("vc").len().iter_rows())
    assert len(counts) == 15
    assert counts["6214e9"] == 41_226
    assert counts["11cb48"] == 16_091
    assert counts["6c71a0"] == 9_953
    assert jobs["submit_s"].min() == 0.0
    span_days = jobs["submit_s"].max() / 86400
    assert span_days == pytest.approx(108.9, abs=0.01)
    assert span_days == pytest.approx(108.896875)


def test_philly_first_row_fields(philly_load) -> None:
    # First data row of the file: 2017-10-09 07:01:55,66.0,1,66.0,11cb48
    row = philly_load.jobs.filter(pl.col("job_id") == "philly-0").row(0, named=True)
    assert row["submit_s"] == (datetime(2017, 10, 9, 7, 1, 55) - ORIGIN).total_seconds()
    assert row["duration_s"] == 66.0
    assert row["num_gpus"] == 1
    assert row["vc"] == "11cb48"
    assert row["gpu_time"] == 66.0
    assert row["user"] is None and row["gpu_type"] is None
    assert row["kind"] == "train"


def test_philly_is_sorted_by_submit_then_job_id(philly_load) -> None:
    jobs = philly_load.jobs
    assert_frame_equal(jobs, jobs.sort(["submit_s", "job_id"]))
    assert jobs["job_id"].n_unique() == jobs.height


def test_philly_gpu_time_is_duration_times_gpus(philly_load) -> None:
    jobs = philly_load.jobs
    assert (jobs["gpu_time"] == jobs["duration_s"] * jobs["num_gpus"]).all()


def test_bundled_copy_loads_like_the_published_file(philly_load, philly_md5: str) -> None:
    bundled = bundled_trace_path()
    assert bundled.parent == Path(gpufleet.__file__).parent / "data" / "traces"
    with gzip.open(bundled, "rb") as fh:
        assert hashlib.md5(fh.read()).hexdigest() == philly_md5
    load = load_trace("philly")
    assert load.source == "philly" and load.reader == "philly"
    assert load.origin == philly_load.origin
    assert_frame_equal(load.jobs, philly_load.jobs)


def test_bundled_attribution_names_sources_and_licences(philly_md5: str) -> None:
    text = (bundled_trace_path().parent / "ATTRIBUTION.md").read_text()
    for needle in ("Jeon", "USENIX ATC 2019", "CC-BY-4.0", "petuum/adaptdl", "osdi21-artifact", philly_md5):
        assert needle in text


def test_csv_reader_on_philly_matches_philly_reader(published_philly: Path, philly_load) -> None:
    # The generic reader detects timestamp/cluster and names jobs "<file stem>-<row>": same result.
    load = load_trace(published_philly, reader="csv")
    assert load.reader == "csv"
    assert_frame_equal(load.jobs, philly_load.jobs)


def test_vc_filter(published_philly: Path) -> None:
    load = load_trace(published_philly, vc="6214e9")
    assert load.jobs.height == 41_226
    assert load.jobs["vc"].unique().to_list() == ["6214e9"]
    assert load.rows_other_vcs == 82_247 - 41_226
    assert load.vc == "6214e9"
    # The origin moves to the first job of the selected vc.
    assert load.jobs["submit_s"].min() == 0.0
    assert load.origin is not None and load.origin >= ORIGIN


def test_unknown_vc_lists_vcs_with_counts(published_philly: Path) -> None:
    with pytest.raises(TraceError) as err:
        load_trace(published_philly, vc="nope")
    message = str(err.value)
    assert "nope" in message and str(published_philly) in message
    assert "6214e9 (41226)" in message and "11cb48 (16091)" in message


def test_import_is_light() -> None:
    src = str(Path(gpufleet.__file__).resolve().parents[1])
    code = "import sys, gpufleet.traces; assert 'polars' not in sys.modules, 'polars imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": src})
