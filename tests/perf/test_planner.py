"""Planner, heterogeneous placement, simulator speed hook and validation against published runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gpufleet
from gpufleet.errors import ConfigError
from gpufleet.perf.ground_truth import default_ground_truth_path, read_cases
from gpufleet.perf.hetero import plan_hetero
from gpufleet.perf.jobspeed import JobSpeedModel
from gpufleet.perf.model_spec import get_model
from gpufleet.perf.options import Layout
from gpufleet.perf.planner import plan_layouts
from gpufleet.perf.step import estimate_step
from gpufleet.perf.system import System
from gpufleet.perf.validate import error_summary, validate_cases
from gpufleet.spec import load_cluster
from gpufleet.spec.catalog import data_file


@pytest.mark.parametrize(
    ("model", "gpu", "gpus", "gbs"),
    [("gpt3-175b", "a100-80g", 12288, 6144), ("llama3-405b", "h100", 2048, 1024), ("gpt-7.5b", "a100-40g", 64, 512)],
)
def test_planner_layouts_use_every_gpu_and_fit(model: str, gpu: str, gpus: int, gbs: int) -> None:
    system = System.build(gpu, "ib-hdr")
    res = plan_layouts(get_model(model), system, gpus, gbs, top=20)
    assert not res.table.is_empty()
    t = res.table
    assert ((t["tp"] * t["pp"] * t["dp"] * t["cp"]) == gpus).all()
    assert (t["memory_gb"] <= system.gpu.memory_gb).all()
    assert (np.diff(t["step_time_s"].to_numpy()) >= 0).all()  # ranked fastest first
    assert res.searched == res.invalid + res.out_of_memory + sum(res.lost_to.values()) + 1


def test_planner_best_matches_scalar_estimate() -> None:
    system = System.build("a100-80g", "roce-200g")
    model = get_model("gpt3-175b")
    res = plan_layouts(model, system, 1024, 1536, top=1)
    est = estimate_step(model, system, res.best, 1536)
    assert est.step_time_s == pytest.approx(float(res.table["step_time_s"][0]), rel=1e-12)


def test_planner_beats_a_hand_layout_it_could_have_chosen() -> None:
    system = System.build("a100-80g", "roce-200g")
    model = get_model("gpt3-175b")
    res = plan_layouts(model, system, 1024, 1536, top=1)
    hand = estimate_step(model, system, Layout(tp=8, pp=16, dp=8, recompute="full"), 1536)
    assert float(res.table["step_time_s"][0]) <= hand.step_time_s


def test_planner_reports_when_nothing_fits() -> None:
    res = plan_layouts(get_model("gpt3-175b"), System.build("t4", "eth-25g", 8, 1), 8, 8)
    assert res.table.is_empty() and res.out_of_memory > 0
    with pytest.raises(ConfigError, match="no layout fits"):
        _ = res.best


def test_holmes_placement_beats_naive_and_trails_all_rdma() -> None:
    cluster = load_cluster(data_file("clusters/hetero-holmes.toml"))
    res = plan_hetero(get_model("gpt-7.5b"), cluster, 768)
    speed = dict(zip(res.summary["placement"], res.summary["tokens_per_s"], strict=True))
    assert speed["holmes"] > speed["naive uniform"]
    assert speed["all-RDMA (same size)"] > speed["holmes"]
    assert res.table["gpus"].sum() == 96
    # naive placement runs the layout a homogeneous planner picks for the best NIC, on the mixed fabric
    layout = dict(zip(res.summary["placement"], res.summary["layout"], strict=True))
    assert layout["naive uniform"] == layout["all-RDMA (same size)"]
    # the Ethernet group's stages carry no more layers than the InfiniBand group's
    layers = {
        g: [int(x) for x in s.split()] for g, s in zip(res.table["group"], res.table["layers_per_stage"], strict=True)
    }
    assert max(layers["eth"]) <= min(layers["ib"])
    assert sum(sum(v) for v in layers.values()) == 36


def test_hetero_rejects_mixed_gpu_types() -> None:
    cluster = load_cluster()  # V100 training pool + T4 inference pool, both listed as pools
    from gpufleet.spec import ClusterSpec

    mixed = ClusterSpec.model_validate(
        {**cluster.model_dump(), "pools": [{**p.model_dump(), "kind": "training"} for p in cluster.pools]}
    )
    with pytest.raises(ConfigError, match="one GPU type"):
        plan_hetero(get_model("gpt-7.5b"), mixed, 64)


def test_job_speed_drops_when_spread_and_caches() -> None:
    speed = JobSpeedModel(get_model("gpt3-1.3b"), System.build("v100", "ib-edr", 8, 1))
    assert speed.relative_speed(8, 1) == pytest.approx(1.0)
    spread = speed.relative_speed(8, 8)
    assert 0.0 < spread < 0.9
    assert speed.throughput(64) > speed.throughput(8)  # more GPUs, more tokens/s
    before = speed.cache_info().hits
    speed.relative_speed(8, 8)
    assert speed.cache_info().hits >= before + 2


def test_validation_reads_the_published_table_and_stays_close() -> None:
    assert default_ground_truth_path() == Path(gpufleet.__file__).parent / "data" / "perf_ground_truth.csv"
    cases, skipped = read_cases()  # the table shipped in the wheel
    assert len(cases) >= 36 and {s.reason for s in skipped}
    fresh = [c for c in cases if c.split == "fresh2"]
    assert len({c.row for c in fresh}) >= 20  # the fresh2 set is read; it is judged once, by bench/perf_planner.py
    table = validate_cases([c for c in cases if c.split in ("calibration", "held-out")])
    summary = {r["subset"]: r for r in error_summary(table).iter_rows(named=True)}
    # the measured accuracy (see docs/perf.md); these guard against regressions, not the bar itself
    assert summary["calibration"]["mean_pct"] < 6.0
    assert summary["all rows"]["mean_pct"] < 8.0
    assert summary["Korthikanti 2022"]["mean_pct"] < 6.0
    assert set(table["split"]) == {"calibration", "held-out"}
