"""The ground truth's data roles: fresh2-fresh4 are read but held apart from every fit; H200 rows map to the catalog."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpufleet.perf.calibrate import calibrate
from gpufleet.perf.efficiency import default_efficiency
from gpufleet.perf.ground_truth import default_ground_truth_path, read_cases
from gpufleet.perf.validate import is_calibration, split_of


def test_fresh2_rows_are_read_with_their_stacks_and_never_calibrate() -> None:
    cases, _ = read_cases()
    fresh2 = [c for c in cases if c.split == "fresh2"]
    assert len({c.row for c in fresh2}) >= 20
    assert {c.options.stack for c in fresh2} >= {"fsdp", "torchtitan", "nemo"}
    assert not any(is_calibration(c) for c in fresh2)
    assert {split_of(c) for c in fresh2} == {"fresh2"}


def test_calibrate_refuses_a_set_without_calibration_rows() -> None:
    cases, _ = read_cases()
    held_apart = [c for c in cases if c.split == "fresh2"][:3]
    with pytest.raises(ValueError, match="no calibration rows"):
        calibrate(held_apart, default_efficiency())


def test_the_old_fresh_rows_joined_calibration() -> None:
    with default_ground_truth_path().open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert "fresh" not in {r["split"] for r in rows}
    # revision 3's fresh set (MosaicML's MPT on H100 among it) now calibrates
    mpt_h100 = [r for r in rows if r["model"].startswith("MPT") and "H100" in r["gpu"] and r["split"] == "calibration"]
    assert len(mpt_h100) >= 3


def test_an_h200_row_reads_as_the_catalog_h200(tmp_path: Path) -> None:
    with default_ground_truth_path().open(newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames
        row = next(r for r in reader if r["src"].startswith("pytorch/torchtitan") and "8B" in r["model"])
    assert columns is not None
    row = {**row, "gpu": "H200 141GB", "split": "calibration"}
    table = tmp_path / "one_row.csv"
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerow(row)
    cases, skipped = read_cases(table)
    assert not skipped
    assert cases[0].system.gpu.name == "h200"
    assert cases[0].system.gpu.memory_gb > 100


def test_fresh3_rows_are_read_and_never_calibrate() -> None:
    cases, _ = read_cases()
    fresh3 = [c for c in cases if c.split == "fresh3"]
    assert len({c.row for c in fresh3}) == 9  # recorded in revision 6 before any prediction was run on them
    assert not any(is_calibration(c) for c in fresh3)
    assert {split_of(c) for c in fresh3} == {"fresh3"}
    with pytest.raises(ValueError, match="no calibration rows"):
        calibrate(fresh3, default_efficiency())


def test_fresh4_rows_are_read_from_two_publications_and_never_calibrate() -> None:
    from gpufleet.perf.crossval import source_document

    cases, _ = read_cases()
    fresh4 = [c for c in cases if c.split == "fresh4"]
    assert len({c.row for c in fresh4}) == 25  # recorded in revision 7 before any prediction was run on them
    assert {source_document(c) for c in fresh4} == {"DGXC Benchmarking 24.11.1", "torchtitan performance doc (2024-08)"}
    assert {c.options.precision for c in fresh4} == {"bf16", "fp8"}
    assert not any(is_calibration(c) for c in fresh4)
    assert {split_of(c) for c in fresh4} == {"fresh4"}
    with pytest.raises(ValueError, match="no calibration rows"):
        calibrate(fresh4, default_efficiency())
