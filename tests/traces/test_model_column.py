"""The optional ``model`` column: mapped with ``--columns model=...`` or detected, kept in the canonical frame."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from gpufleet.errors import TraceError
from gpufleet.traces import load_trace, parse_columns, write_trace
from gpufleet.traces.schema import CANONICAL_COLUMNS


@pytest.fixture()
def model_csv(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text("job_id,submit,duration,gpus,model_name\na,0,100,8,llama2-7b\nb,5,50,1,\nc,7,20,4,resnet50\n")
    return path


def test_mapped_model_name_becomes_a_model_column(model_csv: Path) -> None:
    jobs = load_trace(model_csv, columns=parse_columns("model=model_name")).jobs
    assert jobs.columns == [*CANONICAL_COLUMNS, "model"]
    assert jobs.schema["model"] == pl.String
    assert jobs["model"].to_list() == ["llama2-7b", None, "resnet50"]


def test_model_name_is_detected_without_a_mapping(model_csv: Path) -> None:
    jobs = load_trace(model_csv).jobs
    assert jobs["model"].to_list() == ["llama2-7b", None, "resnet50"]
    assert "model_name" not in jobs.columns


def test_model_column_survives_parquet(model_csv: Path, tmp_path: Path) -> None:
    load = load_trace(model_csv, columns={"model": "model_name"})
    back = load_trace(write_trace(load, tmp_path / "jobs.parquet")).jobs
    assert back.equals(load.jobs)


def test_an_unmapped_column_named_model_is_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "both.csv"
    path.write_text("submit,duration,gpus,model,arch\n0,10,2,7,gpt-7b\n")
    jobs = load_trace(path, columns={"model": "arch"}).jobs
    assert jobs["model"].to_list() == ["gpt-7b"]
    assert jobs["src_model"].to_list() == [7]


def test_mapping_a_missing_model_column_fails(model_csv: Path) -> None:
    with pytest.raises(TraceError, match=r"column 'arch' \(mapped to model\) not found"):
        load_trace(model_csv, columns=parse_columns("model=arch"))
