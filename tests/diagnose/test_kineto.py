"""The Kineto reader on real PyTorch profiler traces (HTA's test data) and on damaged files."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from gpufleet.diagnose.kineto import read_folder, read_trace
from gpufleet.errors import DiagnoseError

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"  # HTA's test traces (MIT), see ATTRIBUTION.md
RANK0 = KINETO / "trace_filter__sampled_rank-0.json.gz"
RANK1 = KINETO / "trace_filter__sampled_rank-1.json.gz"
ALEXNET = KINETO / "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"


def _raw(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def test_real_trace_rows_match_the_json_event_by_event():
    raw = _raw(RANK0)
    complete = [e for e in raw["traceEvents"] if e.get("ph") == "X"]
    t = read_trace(RANK0)
    assert t.rank == 0 and t.rank_source == "distributedInfo" and t.world_size == 128
    assert t.events.filter(pl.col("ph") == "X").height == len(complete)
    kernels = [e for e in complete if e["cat"] == "kernel"]
    frame = t.events.filter(pl.col("cat") == "kernel").sort("ts_ns")
    first = min(kernels, key=lambda e: e["ts"])
    row = frame.row(0, named=True)
    assert row["ts_ns"] == int(first["ts"]) * 1000 and row["dur_ns"] == int(first["dur"]) * 1000  # exact ns
    assert row["correlation"] == first["args"]["correlation"] and row["stream"] == first["args"]["stream"]
    steps = t.events.filter(pl.col("name").str.starts_with("ProfilerStep#"))["name"].unique().sort().to_list()
    assert steps == ["ProfilerStep#551", "ProfilerStep#552"]


def test_flows_are_kept_apart_with_both_flow_names():
    t = read_trace(ALEXNET)
    raw = _raw(ALEXNET)
    flows = [e for e in raw["traceEvents"] if e.get("ph") in ("s", "f")]
    assert t.flows.height == len(flows) > 0
    assert set(t.flows["cat"].unique()) == {e["cat"] for e in flows}


def test_folder_reports_missing_ranks_and_skips_other_json(tmp_path):
    shutil.copy(RANK0, tmp_path / RANK0.name)
    shutil.copy(RANK1, tmp_path / RANK1.name)
    (tmp_path / "fault.json").write_text('{"fault": "none"}')
    ts = read_folder(tmp_path)
    assert ts.ranks == [0, 1]
    assert ts.world_size == 128 and ts.missing_ranks == list(range(2, 128))
    assert [p.name for p in ts.skipped] == ["fault.json"]
    assert set(ts.events["rank"].unique()) == {0, 1}


def test_rank_from_file_name_when_distributed_info_is_missing(tmp_path):
    doc = _raw(RANK1)
    del doc["distributedInfo"]
    (tmp_path / "worker7.json").write_text(json.dumps(doc))
    t = read_trace(tmp_path / "worker7.json")
    assert (t.rank, t.rank_source, t.world_size) == (7, "file name", None)


def test_two_files_of_one_rank_is_an_error_naming_both(tmp_path):
    shutil.copy(RANK0, tmp_path / "a.json.gz")
    shutil.copy(RANK0, tmp_path / "b.json.gz")
    with pytest.raises(DiagnoseError, match=r"rank 0 .*a\.json\.gz"):
        read_folder(tmp_path)


def test_truncated_gzip_names_file_and_offset(tmp_path):
    cut = tmp_path / "rank-0.json.gz"
    cut.write_bytes(RANK0.read_bytes()[:40_000])
    with pytest.raises(DiagnoseError, match=r"rank-0\.json\.gz: gzip stream truncated at byte 40000"):
        read_trace(cut)


def test_truncated_and_malformed_json_name_the_offset(tmp_path):
    text = gzip.decompress(RANK0.read_bytes())
    cut = tmp_path / "rank-0.json"
    cut.write_bytes(text[:5000])
    with pytest.raises(DiagnoseError, match=r"rank-0\.json: trace JSON ends early at offset \d+"):
        read_trace(cut)
    bad = tmp_path / "rank-1.json"
    bad.write_bytes(text[:100] + b"}}}" + text[103:])
    with pytest.raises(DiagnoseError, match=r"rank-1\.json: trace JSON is malformed at offset \d+ of"):
        read_trace(bad)


def test_not_a_trace_alone_and_an_empty_folder_are_errors(tmp_path):
    f = tmp_path / "x.json"
    f.write_text('{"a": 1}')
    with pytest.raises(DiagnoseError, match="not a PyTorch profiler"):
        read_folder(f)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DiagnoseError, match="no trace files"):
        read_folder(empty)
    with pytest.raises(DiagnoseError, match="no such file or folder"):
        read_folder(tmp_path / "missing")
