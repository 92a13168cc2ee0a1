"""Revision 8: NeMo's own bf16 and fp8 constants, and the judged fresh sets in the calibration pool."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.perf.calibrate import FITTED
from gpufleet.perf.efficiency import default_efficiency
from gpufleet.perf.ground_truth import read_cases
from gpufleet.perf.validate import predict_case, seen_cases


def _nemo_case(precision: str):
    cases, _ = read_cases()
    return next(c for c in seen_cases(cases) if c.options.stack == "nemo" and c.options.precision == precision)


def _with_nemo(compute: float, fp8: float):
    data = default_efficiency().model_dump()
    data["stack"]["nemo"] = {"compute": compute, "fp8": fp8}
    return type(default_efficiency()).model_validate(data)


def test_nemo_is_fitted_with_a_compute_and_an_fp8_constant() -> None:
    assert {(s, k) for s, k, _, _ in FITTED} >= {("stack.nemo", "compute"), ("stack.nemo", "fp8")}
    assert "nemo" in default_efficiency().stack  # the shipped file carries its table: no fallback to megatron-core


def test_nemo_fp8_constant_moves_fp8_rows_only() -> None:
    bf16, fp8 = _nemo_case("bf16"), _nemo_case("fp8")
    base, slow = _with_nemo(1.0, 1.0), _with_nemo(1.0, 0.8)
    assert predict_case(bf16, slow)["step_time_s"] == pytest.approx(predict_case(bf16, base)["step_time_s"])
    assert predict_case(fp8, slow)["step_time_s"] > predict_case(fp8, base)["step_time_s"] * 1.01


def test_nemo_compute_constant_moves_nemo_rows_but_not_megatron_core() -> None:
    bf16 = _nemo_case("bf16")
    core = dataclasses.replace(bf16, options=bf16.options.model_copy(update={"stack": "megatron-core"}))
    base, fast = _with_nemo(1.0, 1.0), _with_nemo(1.2, 1.0)
    assert predict_case(bf16, fast)["step_time_s"] < predict_case(bf16, base)["step_time_s"] * 0.95
    assert predict_case(core, fast)["step_time_s"] == pytest.approx(predict_case(core, base)["step_time_s"])


def test_judged_fresh_sets_calibrate_while_held_out_and_unseen_rows_never_do() -> None:
    from gpufleet.perf.validate import CALIBRATION_SPLITS, UNSEEN_SPLITS, is_calibration

    assert set(CALIBRATION_SPLITS) == {"calibration", "fresh2", "fresh3", "fresh4"}  # fresh5 seen, not calibrating
    assert "held-out" not in CALIBRATION_SPLITS and not set(UNSEEN_SPLITS) & set(CALIBRATION_SPLITS)
    cases, _ = read_cases()
    by_split: dict[str, set[bool]] = {}
    for c in cases:
        by_split.setdefault(c.split, set()).add(is_calibration(c))
    assert by_split["held-out"] == {False}
    assert by_split["fresh2"] == by_split["fresh3"] == by_split["fresh4"] == by_split["calibration"] == {True}
    assert by_split["fresh5"] == {False}  # revision 9: seen (in every LOSO fold) but not in the fit


def test_interleaved_p2p_overlap_hides_pipeline_sends_only_with_virtual_stages() -> None:
    from gpufleet.perf.model_spec import load_model
    from gpufleet.perf.options import Layout, TrainOptions
    from gpufleet.perf.stacks import get_stack
    from gpufleet.perf.step import estimate_step
    from gpufleet.perf.system import System

    model, system = load_model("gpt3-175b"), System.build("h100", "ib-ndr")
    exposed = default_efficiency().software.pp_overlap_exposed

    def pp_comm(vp: int, on: bool) -> float:
        layout = Layout(tp=4, pp=8, dp=4, vp=vp)
        return estimate_step(model, system, layout, 256, options=TrainOptions(pp_overlap_interleaved=on)).values[
            "pp_comm"
        ]

    assert pp_comm(1, True) == pytest.approx(pp_comm(1, False))  # 1F1B: overlap_p2p_comm does not apply
    assert pp_comm(6, True) == pytest.approx(pp_comm(6, False) * exposed)
    assert get_stack("nemo").options["pp_overlap_interleaved"] is True
    cases, _ = read_cases()
    nemo = [c for c in seen_cases(cases) if c.options.stack == "nemo"]
    assert nemo and all(c.options.pp_overlap_interleaved for c in nemo)  # every source's nemo rows take it
    assert not any(c.options.pp_overlap_interleaved for c in cases if c.options.stack != "nemo")
