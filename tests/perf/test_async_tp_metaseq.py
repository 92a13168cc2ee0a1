"""Revision 7: torchtitan's async TP hides the forward's TP collectives only; OPT-175B runs on a metaseq stack."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.perf.calibrate import calibrate
from gpufleet.perf.efficiency import default_efficiency
from gpufleet.perf.ground_truth import read_cases
from gpufleet.perf.model_spec import get_model
from gpufleet.perf.options import Layout, TrainOptions
from gpufleet.perf.stacks import get_stack, resolve_stack
from gpufleet.perf.step import estimate_step
from gpufleet.perf.system import System


def _tp_comm(recompute: str, overlap: bool, backward: bool = True) -> float:
    system = System.build("h100", "ib-ndr")
    layout = Layout(tp=8, dp=8, mbs=1, recompute=recompute)
    options = TrainOptions(tp_overlap=overlap, tp_overlap_backward=backward)
    return estimate_step(get_model("llama3-70b"), system, layout, 64, options=options).values["tp_comm"]


@pytest.mark.parametrize(("recompute", "backward_share"), [("none", 2 / 4), ("full", 2 / 6)])
def test_forward_only_overlap_leaves_the_backward_collectives_exposed(recompute: str, backward_share: float) -> None:
    none, both, forward_only = _tp_comm(recompute, False), _tp_comm(recompute, True), _tp_comm(recompute, True, False)
    assert both < forward_only < none
    # the backward's two all-reduce equivalents of a layer's four (six with the forward run again) lose the overlap
    assert (forward_only - both) / (none - both) == pytest.approx(backward_share, rel=1e-9)


def test_torchtitan_rows_overlap_the_forward_only_and_other_stacks_both() -> None:
    assert get_stack("torchtitan").options["tp_overlap_backward"] is False
    cases, _ = read_cases()
    async_tp = [c for c in cases if c.options.stack == "torchtitan" and c.options.tp_overlap]
    assert async_tp and all(not c.options.tp_overlap_backward for c in async_tp)
    nemo = [c for c in cases if c.options.stack == "nemo" and c.options.tp_overlap]
    assert nemo and all(c.options.tp_overlap_backward for c in nemo)


def test_opt_runs_on_metaseq_which_falls_back_to_megatron_2021_without_a_calibration_row() -> None:
    cases, _ = read_cases()
    opt = [c for c in cases if c.model.name.lower().startswith("opt-175b")]
    assert opt and {c.options.stack for c in opt} == {"metaseq"}
    assert get_stack("metaseq").relative == "megatron-2021"
    constants, used, note = resolve_stack("metaseq", default_efficiency())
    assert used == "megatron-2021" and "no fitted constants" in note
    assert constants is default_efficiency().stack["megatron-2021"]


def test_calibrate_fits_metaseq_only_where_its_row_calibrates() -> None:
    cases, _ = read_cases()
    opt = next(c for c in cases if c.model.name.lower().startswith("opt-175b"))
    other = next(c for c in cases if c.split == "calibration" and c.options.stack == "megatron-2021")
    without, _ = calibrate([other], default_efficiency(), max_nfev=2)
    assert "metaseq" not in without.stack  # no row of it calibrates: it keeps falling back
    with_opt, _ = calibrate([other, dataclasses.replace(opt, split="calibration")], default_efficiency(), max_nfev=2)
    assert "metaseq" in with_opt.stack
    assert resolve_stack("metaseq", with_opt)[1] == "metaseq"


def _compute(precision: str, overhead_us: float, hidden: int) -> float:
    eff = default_efficiency()
    eff = eff.model_copy(update={"software": eff.software.model_copy(update={"fp8_layer_overhead_us": overhead_us})})
    model = get_model("llama3-8b").with_overrides(hidden=hidden)
    system = System.build("h100", "ib-ndr")
    layout = Layout(tp=1, dp=8, mbs=1)
    options = TrainOptions(precision=precision)
    return estimate_step(model, system, layout, 64, options=options, efficiency=eff).values["compute"]


def test_fp8_scaling_kernels_cost_a_fixed_time_per_layer_that_weighs_most_on_small_models() -> None:
    layers = get_model("llama3-8b").layers
    micro_batches = 64 // 8
    for hidden in (2048, 8192):
        added = _compute("fp8", 150.0, hidden) - _compute("fp8", 0.0, hidden)
        assert added == pytest.approx(layers * micro_batches * 150e-6, rel=1e-6)
    assert _compute("bf16", 150.0, 4096) == _compute("bf16", 0.0, 4096)  # bf16 runs launch no scaling kernels
    small = (_compute("fp8", 150.0, 2048) / _compute("fp8", 0.0, 2048)) - 1.0
    large = (_compute("fp8", 150.0, 8192) / _compute("fp8", 0.0, 8192)) - 1.0
    assert small > 2.0 * large
