"""Generic CSV reading: column mappings, auto-detection, bad-row accounting, file-level errors."""

from __future__ import annotations

import gzip
from datetime import datetime
from pathlib import Path

import pytest

from gpufleet.errors import TraceError
from gpufleet.traces import get_reader, load_trace, parse_columns, reader_names
from gpufleet.traces.validate import (
    BAD_GPUS,
    BAD_SUBMIT,
    DURATION_NOT_FINITE,
    DURATION_NOT_POSITIVE,
    GPUS_NOT_POSITIVE,
    MISSING_SUBMIT,
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


ELASTICFLOW = "job_id,submission_time,duration,num_gpu\nj1,5810,288476,16\nj0,10,60,1\n"


def test_column_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "name,t_submit,runtime,ngpu,team\nx,100,50,2,a\ny,20,7,1,b\n")
    load = load_trace(path, columns={"job_id": "name", "submit": "t_submit", "duration": "runtime", "gpus": "ngpu"})
    assert load.reader == "csv"
    assert load.jobs["job_id"].to_list() == ["y", "x"]  # sorted by submit
    assert load.jobs["submit_s"].to_list() == [20.0, 100.0]  # numeric seconds kept as is
    assert load.jobs["duration_s"].to_list() == [7.0, 50.0]
    assert load.jobs["num_gpus"].to_list() == [1, 2]
    assert load.jobs["team"].to_list() == ["b", "a"]  # extra column kept after the canonical ones
    assert load.origin is None


def test_cli_mapping_string(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "id,submission_time,duration,num_gpu\na,1,2,3\n")
    columns = parse_columns("submit=submission_time, duration=duration,gpus=num_gpu")
    assert columns == {"submit": "submission_time", "duration": "duration", "gpus": "num_gpu"}
    load = load_trace(path, columns=columns)
    assert load.jobs.row(0)[:4] == ("a", 1.0, 2.0, 3)


@pytest.mark.parametrize(
    "spec",
    ["", "submit", "submit=", "=x", "submit=a,,duration=b", "when=a", "submit=a,submit_s=b"],
)
def test_parse_columns_rejects_malformed(spec: str) -> None:
    with pytest.raises(TraceError):
        parse_columns(spec)


def test_parse_columns_names_unknown_key() -> None:
    with pytest.raises(TraceError, match=r"unknown key 'when'.*submit"):
        parse_columns("when=a")


def test_missing_mapped_column_names_column_and_available(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", ELASTICFLOW)
    with pytest.raises(TraceError) as err:
        load_trace(path, columns={"submit": "submit_time", "duration": "duration", "gpus": "num_gpu"})
    message = str(err.value)
    assert str(path) in message
    assert "'submit_time'" in message
    assert "job_id, submission_time, duration, num_gpu" in message


def test_undetectable_columns_name_the_fix(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match=r"submit_s, duration_s, num_gpus.*a, b, c.*--columns"):
        load_trace(path)


def test_unknown_mapping_key(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", ELASTICFLOW)
    with pytest.raises(TraceError, match="unknown column key 'start'"):
        load_trace(path, columns={"start": "submission_time"})


def test_auto_detects_elasticflow_names_in_gzip(tmp_path: Path) -> None:
    load = load_trace(write(tmp_path, "cluster04.csv.gz", ELASTICFLOW))
    assert load.reader == "csv"
    assert load.jobs["job_id"].to_list() == ["j0", "j1"]
    assert load.jobs["num_gpus"].to_list() == [1, 16]


def test_generated_job_ids_use_file_stem(tmp_path: Path) -> None:
    load = load_trace(write(tmp_path, "mine.csv", "submit_s,duration_s,num_gpus\n3,1,1\n2,1,1\n"))
    assert load.jobs["job_id"].to_list() == ["mine-1", "mine-0"]


def test_datetime_submits_set_the_origin(tmp_path: Path) -> None:
    text = (
        "job_id,submit,duration_s,num_gpus\n"
        "a,2024-01-02T00:00:30Z,10,1\n"
        "b,2024-01-02T01:00:00+01:00,10,1\n"  # = 2024-01-02 00:00:00 UTC
        "c,2024-01-02 00:01:00.5,10,1\n"
    )
    load = load_trace(write(tmp_path, "t.csv", text))
    assert load.origin == datetime(2024, 1, 2)
    assert dict(zip(load.jobs["job_id"], load.jobs["submit_s"], strict=True)) == {
        "b": 0.0,
        "a": 30.0,
        "c": 60.5,
    }


BAD_ROWS = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,a
2017-10-09 07:02:55,-5.0,1,66.0,a
2017-10-09 07:03:55,66.0,0,0,b
2017-13-45 99:00:00,66.0,1,66.0,b
2017-10-09 07:05:55,100.0,2,200.0,b
,66.0,1,66.0,a
2017-10-09 07:06:55,0,1,0,a
2017-10-09 07:07:55,nan,1,0,a
2017-10-09 07:08:55,10,lots,0,a
2017-10-09 07:09:55,20,4,80,a

"""


def test_bad_rows_are_counted_by_reason_and_good_rows_kept(tmp_path: Path) -> None:
    load = load_trace(write(tmp_path, "bad.csv", BAD_ROWS))
    assert load.reader == "philly"
    assert load.rows_read == 10  # the trailing blank line is not a record
    assert load.rejected == {
        DURATION_NOT_POSITIVE: 2,
        BAD_GPUS: 1,
        BAD_SUBMIT: 1,
        DURATION_NOT_FINITE: 1,
        MISSING_SUBMIT: 1,
        GPUS_NOT_POSITIVE: 1,
    }
    assert load.rejected_examples[DURATION_NOT_POSITIVE] == [1, 6]
    assert load.rejected_examples[BAD_SUBMIT] == [3]
    assert load.rejected_examples[GPUS_NOT_POSITIVE] == [2]
    assert load.jobs["job_id"].to_list() == ["philly-0", "philly-4", "philly-9"]
    assert load.jobs["submit_s"].to_list() == [0.0, 240.0, 480.0]
    assert load.jobs.height + load.rejected_total == load.rows_read
    summary = load.rejected_summary()
    assert "rejected 7 of 10 rows" in summary and "duration_s <= 0: 2 (rows 1, 6)" in summary


def test_vc_filter_counts_rejects_of_that_vc_only(tmp_path: Path) -> None:
    load = load_trace(write(tmp_path, "bad.csv", BAD_ROWS), vc="b")
    assert load.jobs["job_id"].to_list() == ["philly-4"]
    assert load.rejected == {GPUS_NOT_POSITIVE: 1, BAD_SUBMIT: 1}
    assert load.rows_other_vcs == 7
    assert load.jobs["submit_s"].to_list() == [0.0]


def test_more_bad_values(tmp_path: Path) -> None:
    text = (
        "job_id,submit_s,duration_s,num_gpus,kind\n"
        "a,1,1,1,train\n"
        "a,2,1,1,train\n"  # duplicate id
        ",3,1,1,train\n"  # missing id
        "b,-1,1,1,train\n"
        "c,4,1,1.5,train\n"
        "d,5,1,1,serving\n"
        "e,6,inf,1,Inference\n"
        "f,7,1,1e12,\n"
    )
    load = load_trace(write(tmp_path, "t.csv", text))
    assert load.jobs["job_id"].to_list() == ["a"]
    assert load.rejected == {
        "duplicate job_id": 1,
        "duration_s is NaN or infinite": 1,
        "kind is not 'train' or 'inference'": 1,
        "missing job_id": 1,
        "num_gpus > 2147483647": 1,
        "num_gpus is not a whole number": 1,
        "submit_s < 0": 1,
    }


def test_kind_is_normalised(tmp_path: Path) -> None:
    text = "job_id,submit_s,duration_s,num_gpus,kind\na,1,1,1,Inference\nb,2,1,1,\n"
    load = load_trace(write(tmp_path, "t.csv", text))
    assert load.jobs["kind"].to_list() == ["inference", "train"]


def test_ragged_line_is_a_file_error_with_line_number(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "submit_s,duration_s,num_gpus\n1,2,3\n4,5,6,7\n")
    with pytest.raises(TraceError, match=r"t\.csv: a row has more fields than the header \(line 3\)"):
        load_trace(path)


def test_unmatched_quote_is_a_file_error(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", 'submit_s,duration_s,num_gpus\n1,"2,3\n')
    with pytest.raises(TraceError, match="unmatched double quote"):
        load_trace(path)


def test_header_only_gives_empty_trace(tmp_path: Path) -> None:
    load = load_trace(write(tmp_path, "t.csv", "submit_s,duration_s,num_gpus\n"))
    assert load.jobs.height == 0 and load.rows_read == 0 and load.rejected == {}


@pytest.mark.parametrize(
    ("name", "text", "kwargs", "pattern"),
    [
        ("t.csv", "", {}, "the file is empty"),
        ("t.txt", "a\n", {}, "cannot tell the trace format"),
        (
            "t.csv",
            ELASTICFLOW,
            {"reader": "tsv"},
            "unknown trace reader 'tsv'; available readers: csv, parquet",
        ),
        ("t.csv", ELASTICFLOW, {"reader": "philly"}, "'timestamp'.*not a philly trace.*--reader csv"),
        ("t.parquet", "junk", {}, "not a readable Parquet file"),
    ],
)
def test_file_level_errors(tmp_path: Path, name: str, text: str, kwargs: dict, pattern: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError, match=pattern) as err:
        load_trace(path, **kwargs)
    assert str(path) in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"no such file.*'philly'"):
        load_trace(tmp_path / "absent.csv")


def test_registry() -> None:
    assert {"philly", "csv", "parquet"} <= set(reader_names())
    assert get_reader("philly").name == "philly"
