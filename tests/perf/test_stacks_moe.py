"""Training stacks, mixture-of-experts, FSDP and the ground-truth table's stack/split columns (issue 28)."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.errors import ConfigError, SpecError
from gpufleet.perf.efficiency import default_efficiency, jobspeed_efficiency
from gpufleet.perf.flops import active_params, model_flops_per_token, param_count
from gpufleet.perf.ground_truth import _layout_text, read_cases
from gpufleet.perf.model_spec import get_model
from gpufleet.perf.options import Layout, TrainOptions
from gpufleet.perf.planner import plan_layouts
from gpufleet.perf.stacks import REFERENCE_STACK, get_stack, resolve_stack, stack_names
from gpufleet.perf.step import estimate_step, evaluate, layout_problems
from gpufleet.perf.system import System

A100 = System.build("a100-80g", "ib-hdr")
H800 = System.build("h800", "ib-ndr")


# ---------------------------------------------------------------------------------------------- stacks
def test_every_stack_resolves_and_unfitted_ones_say_whose_constants_they_borrow():
    eff = default_efficiency()
    for name in stack_names():
        constants, used, note = resolve_stack(name, eff)
        assert used in stack_names()
        if name in eff.stack:
            assert used == name and not note and constants is eff.stack[name]
        elif name != REFERENCE_STACK:
            assert used != name and name in note and used in note
    assert resolve_stack(None, eff) == (None, REFERENCE_STACK, "")
    with pytest.raises(SpecError, match="--stack takes one of"):
        get_stack("megatron-1999")


def test_a_slower_stack_slows_compute_and_only_compute():
    model = get_model("gpt3-175b")
    eff = default_efficiency()
    slow = min(eff.stack.values(), key=lambda c: c.compute)
    name = next(n for n, c in eff.stack.items() if c is slow)
    assert slow.compute < 1.0
    layout = Layout(tp=8, pp=8, dp=16, vp=6)
    ref = estimate_step(model, A100, layout, 1536, options=TrainOptions(), efficiency=eff).values
    st = estimate_step(model, A100, layout, 1536, options=TrainOptions(stack=name), efficiency=eff).values
    assert st["compute"] == pytest.approx(ref["compute"] / slow.compute, rel=0.05)
    assert st["dp_comm_exposed"] <= ref["dp_comm_exposed"] + 1e-12  # more compute hides as much DP traffic
    assert st["step_time_s"] > ref["step_time_s"]


def test_the_planner_only_searches_what_the_stack_runs():
    model = get_model("gpt-7.5b")
    opts = TrainOptions(stack="deepspeed-megatron", **get_stack("deepspeed-megatron").options)
    res = plan_layouts(model, A100, 128, 512, options=opts, top=50)
    assert set(res.table["vp"].to_list()) == {1}  # DeepSpeed's pipeline engine has no interleaved schedule
    assert "selective" not in set(res.table["recompute"].to_list())


# ---------------------------------------------------------------------------------------------- MoE
def test_deepseek_v3_and_mixtral_match_their_published_parameter_counts():
    v3 = get_model("deepseek-v3")
    assert param_count(v3) / 1e9 == pytest.approx(671, rel=0.01)  # 671B total (MTP module excluded)
    assert active_params(v3) / 1e9 == pytest.approx(37, rel=0.03)  # 37B activated
    # ISCA 2025 Table 2: about 250 GFLOP per token at 4K, causal attention
    assert model_flops_per_token(v3, causal=True) / 1e9 == pytest.approx(250, rel=0.03)
    mix = get_model("mixtral-8x7b")
    assert param_count(mix) / 1e9 == pytest.approx(46.7, rel=0.02)
    assert active_params(mix) / 1e9 == pytest.approx(12.9, rel=0.03)
    dense = get_model("gpt3-175b")
    assert active_params(dense) == param_count(dense)


def test_expert_parallelism_shards_expert_memory_and_costs_all_to_all():
    v3 = get_model("deepseek-v3")
    opts = TrainOptions(precision="fp8")
    eps = np.array([1, 8, 64])
    out = evaluate(v3, H800, 15360, 1, 16, 128, 1, 1, 2, 1, None, opts, ep=eps)
    assert np.all(np.diff(out["memory_states_gb"]) < 0)  # experts spread over more ranks
    assert out["ep_comm"][0] == 0.0 and out["ep_comm"][1] > 0.0  # EP8 in one node: NVLink only
    assert out["ep_comm"][2] > out["ep_comm"][1]  # EP64 over 8 nodes crosses the NICs
    overlapped = evaluate(
        v3, H800, 15360, 1, 16, 128, 1, 1, 2, 1, None, opts.model_copy(update={"ep_overlap": True}), ep=64
    )
    assert overlapped["ep_comm"] < out["ep_comm"][2]
    parts = sum(out[k] for k in ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_bubble", "pp_comm", "dp_comm_exposed"))
    assert np.allclose(parts + out["optimizer"] + out["overhead"], out["step_time_s"])


def test_a_capacity_factor_pads_expert_work():
    mix = get_model("mixtral-8x7b")
    padded = mix.with_overrides(capacity_factor=1.25)
    args = (System.build("h100", "ib-ndr"), 256, 1, 4, 16, 1, 1, 8, 0, 4096, TrainOptions())
    base, cf = evaluate(mix, *args, ep=8), evaluate(padded, *args, ep=8)
    assert cf["compute"] > base["compute"] and cf["ep_comm"] == pytest.approx(1.25 * base["ep_comm"])


def test_ep_layout_rules_and_planner_search():
    dense = get_model("gpt3-175b")
    problems = layout_problems(dense, 64, 64, Layout(tp=8, pp=1, dp=8, ep=8))
    assert any("mixture-of-experts" in p for p in problems)
    v3 = get_model("deepseek-v3")
    problems = layout_problems(v3, 2048, 15360, Layout(tp=1, pp=16, dp=128, ep=48))
    assert any("does not divide" in p for p in problems)
    res = plan_layouts(v3, H800, 2048, 15360, options=TrainOptions(precision="fp8"), top=200)
    assert (res.table["ep"] > 1).any()
    assert res.best.ep == res.table["ep"][0]
    assert set(plan_layouts(dense, A100, 64, 256, top=50).table["ep"].to_list()) == {1}


# ---------------------------------------------------------------------------------------------- FSDP
def test_fsdp_without_resharding_gathers_once_per_step():
    model = get_model("llama3-70b")
    sys_ = System.build("h100", "roce-400g")
    base = TrainOptions(zero=3, sequence_parallel=True)
    args = (model, sys_, 256, 8, 8, 4, 1, 1, 1, 2, None)
    reshard = evaluate(*args, base)
    keep = evaluate(*args, base.model_copy(update={"reshard_after_forward": False}))
    assert float(reshard["microbatches"]) > 1
    assert keep["dp_comm_exposed"] < reshard["dp_comm_exposed"]


def test_job_speed_runs_on_frozen_constants():
    from gpufleet.perf.jobspeed import JobSpeedModel

    js = JobSpeedModel(get_model("gpt3-1.3b"), A100)
    assert js.efficiency is jobspeed_efficiency()
    assert js.throughput(1) >= 0.0  # one GPU: a number (0 when nothing fits), not an exception


# ---------------------------------------------------------------------------------------------- ground truth
def test_layouts_written_in_notes_are_read():
    assert _layout_text({"notes": "FSDP32 TP8; 71.9 GiB", "reported": ""}) == {"dp": 32, "tp": 8, "pp": 1}
    found = _layout_text({"notes": "VP=4; EP64", "reported": "FSDP8 TP8 PP8 interleaved"})
    assert found["ep"] == 64 and found["vp"] == 4 and found["pp"] == 8 and found["interleaved"] == 1


def test_every_row_with_a_shape_and_layout_is_predicted_with_its_stack_and_split():
    cases, skipped = read_cases()
    assert all(("layout" in s.reason) or ("GPU" in s.reason) for s in skipped)
    assert {c.split for c in cases} == {"calibration", "held-out", "fresh2", "fresh3", "fresh4", "fresh5"}
    assert all(c.options.stack in stack_names() for c in cases)
    v3 = [c for c in cases if c.model.name.startswith("deepseek-v3")]
    assert v3 and all(c.ep > 1 and c.model.is_moe for c in v3)
    # a stack that calibrates has calibration rows, and every stack with constants was fitted on some
    fitted = set(default_efficiency().stack)
    calibrating = {c.options.stack for c in cases if c.split == "calibration"}
    assert fitted <= calibrating


def test_a_table_without_split_or_stack_columns_still_reads(tmp_path):
    import polars as pl

    from gpufleet.perf.ground_truth import default_ground_truth_path
    from gpufleet.perf.validate import is_calibration

    frame = pl.read_csv(default_ground_truth_path(), infer_schema_length=0).drop("stack", "split", "ep")
    path = tmp_path / "old.csv"
    frame.write_csv(path)
    cases, _ = read_cases(path)
    assert cases and all(c.split == "" for c in cases)
    # from each source's family; a publication without rules of its own takes the reference (stack None)
    assert all(c.options.stack in stack_names() for c in cases if c.group != "other publications")
    assert all(c.options.stack is None for c in cases if c.group == "other publications")
    assert any(is_calibration(c) for c in cases) and not all(is_calibration(c) for c in cases)


def test_validate_filters_by_stack_and_plans_each_run():
    from gpufleet.perf.reference_runs import validate_table

    run = validate_table(stack="megatron-2021", planner=True)
    assert set(run.table["stack"].to_list()) == {"megatron-2021"}
    assert run.planner is not None and run.planner.height == run.table["row"].n_unique()
    assert {"published_layout", "best_layout", "gap_pct"} <= set(run.planner.columns)
    assert (run.table["gpu_memory_gb"] > 0).all()
    with pytest.raises(ConfigError, match="stack"):
        validate_table(stack="holmes")
