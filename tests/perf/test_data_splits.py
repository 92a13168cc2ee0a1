"""The ground truth's data roles: fresh sets held apart from every fit until judged (none unseen now); H200 rows."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpufleet.perf.calibrate import calibrate
from gpufleet.perf.efficiency import default_efficiency
from gpufleet.perf.ground_truth import default_ground_truth_path, read_cases
from gpufleet.perf.validate import is_calibration, split_of


def test_fresh2_rows_are_read_with_their_stacks_and_calibrate_since_revision_8() -> None:
    cases, _ = read_cases()
    fresh2 = [c for c in cases if c.split == "fresh2"]
    assert len({c.row for c in fresh2}) >= 20
    assert {c.options.stack for c in fresh2} >= {"fsdp", "torchtitan", "nemo"}
    assert all(is_calibration(c) for c in fresh2)  # judged (revision 4); calibrates since revision 8
    assert {split_of(c) for c in fresh2} == {"fresh2"}


def test_calibrate_refuses_a_set_without_calibration_rows() -> None:
    cases, _ = read_cases()
    held_apart = [c for c in cases if c.split == "held-out"][:3]
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


def test_fresh3_rows_are_read_and_calibrate_since_revision_8() -> None:
    cases, _ = read_cases()
    fresh3 = [c for c in cases if c.split == "fresh3"]
    assert len({c.row for c in fresh3}) == 9  # recorded in revision 6 before any prediction was run on them
    assert all(is_calibration(c) for c in fresh3)
    assert {split_of(c) for c in fresh3} == {"fresh3"}


def test_fresh4_rows_are_read_from_two_publications_and_calibrate_since_revision_8() -> None:
    from gpufleet.perf.crossval import source_document

    cases, _ = read_cases()
    fresh4 = [c for c in cases if c.split == "fresh4"]
    assert len({c.row for c in fresh4}) == 25  # recorded in revision 7 before any prediction was run on them
    assert {source_document(c) for c in fresh4} == {"DGXC Benchmarking 24.11.1", "torchtitan performance doc (2024-08)"}
    assert {c.options.precision for c in fresh4} == {"bf16", "fp8"}
    assert all(is_calibration(c) for c in fresh4)
    assert {split_of(c) for c in fresh4} == {"fresh4"}


def test_fresh5_rows_are_one_seen_document_that_does_not_calibrate() -> None:
    from gpufleet.perf import crossval
    from gpufleet.perf.validate import UNSEEN_SPLITS, seen_cases

    cases, _ = read_cases()
    fresh5 = [c for c in cases if c.split == "fresh5"]
    assert len({c.row for c in fresh5}) == 31  # recorded in revision 8 (9501f13) before any prediction was run on them
    assert {crossval.source_document(c) for c in fresh5} == {"DGXC Benchmarking 25.x"}
    assert {c.model.name for c in fresh5} >= {"nemotron4-340b", "nemotron4-15b", "deepseek-v3"}
    assert any(c.model.experts for c in fresh5) and any(c.ep > 1 for c in fresh5)
    # judged once at revision 8's end: seen since, so they enter every fold; they do not calibrate (revision 9: with
    # them the refit pressed InfiniBand's efficiency onto its bound to absorb the MoE misses)
    assert "fresh5" not in UNSEEN_SPLITS
    assert not any(is_calibration(c) for c in fresh5)
    assert len([c for c in seen_cases(cases) if c.split == "fresh5"]) == len(fresh5)
