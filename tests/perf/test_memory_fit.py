"""Revision 2 of the memory model: per-op activation inventories, per-rank pipeline memory, published runs fit."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.perf.efficiency import default_efficiency, jobspeed_efficiency
from gpufleet.perf.ground_truth import read_cases
from gpufleet.perf.memory import activation_inventory, in_flight_stages, op_sac_recompute_share
from gpufleet.perf.model_spec import get_model
from gpufleet.perf.validate import predict_case

#: Published runs the memory model still predicts over their GPU's memory, and why (docs/perf.md, Limits).
KNOWN_OVER: dict[int, str] = {}  # revision 9: none in any split (revision 6: none of calibration / held-out)


def _inv(model, **kw):
    args = {"seq": model.seq, "tp": np.array([1.0]), "recompute_code": np.array([0]), "sequence_parallel": True}
    args.update(kw)
    return float(activation_inventory(model, flash=True, **args)[0])


def test_every_published_layout_fits_as_published():
    cases, _ = read_cases()
    over = []
    for case in cases:  # every split (revision 9: every published row fits)
        p = predict_case(case, default_efficiency())
        if not p["fits"] and case.row not in KNOWN_OVER:
            over.append(f"row {case.row} {case.label}: {p['memory_gb']:.1f} of {case.system.gpu.memory_gb:g} GiB")
    assert not over, over


def test_dropout_fp8_and_lean_recipes_keep_less():
    llama = get_model("llama3-8b")
    with_dropout = llama.with_overrides(dropout=True)
    assert _inv(with_dropout) > _inv(llama)
    assert _inv(llama, fp8_cache=True) < _inv(llama)
    dsv3 = get_model("deepseek-v3")
    assert _inv(dsv3, fp8_cache=True, lean=True) < _inv(dsv3, fp8_cache=True) < _inv(dsv3)


def test_op_level_selective_checkpointing_keeps_less_and_recomputes_a_share():
    llama = get_model("llama3-8b")
    none = _inv(llama, recompute_code=np.array([0]))
    op = _inv(llama, recompute_code=np.array([1]), selective_policy="op")
    attention = _inv(llama, recompute_code=np.array([1]))
    assert op < 0.6 * none
    assert attention == pytest.approx(none)  # with flash attention there are no scores to drop
    assert 0.0 < op_sac_recompute_share(llama) < 0.5


def test_in_flight_micro_batches_per_rank():
    pp, vp, m = np.array([16.0]), np.array([4.0]), np.array([64.0])
    first = float(in_flight_stages(pp, vp, m, 0)[0])
    assert first == pytest.approx(16 + 15 / 4)  # Korthikanti 2022: p (1 + (p-1)/(p v))
    assert float(in_flight_stages(pp, vp, m, 1)[0]) < first
    assert float(in_flight_stages(pp, vp, m, -1)[0]) < float(in_flight_stages(pp, vp, m, 1)[0])
    assert float(in_flight_stages(pp, np.array([1.0]), m, 0, dualpipe=True)[0]) == 17.0
    assert float(in_flight_stages(pp, np.array([1.0]), np.array([4.0]), 0)[0]) == 4.0  # fewer micro-batches


def test_simulator_constants_keep_revision_one():
    assert jobspeed_efficiency().software.revision == 1
    assert default_efficiency().software.revision == 3


def test_routed_experts_keep_no_output_for_the_weighted_combine():
    # Megatron-Core scales the SwiGLU output by the router weight inside the expert (weighted_bias_swiglu_impl), so
    # the combine is a scatter-add that keeps nothing: a routed copy keeps its dispatched input and its MLP only
    v3 = get_model("deepseek-v3")
    h, ew = float(v3.hidden), float(v3.expert_width)
    frac = v3.moe_layers / v3.layers
    routed_copy = 2.0 * h + 2.0 * 2.0 * ew + 2.0 * ew  # bf16 input, two fc1 outputs (GLU), the fc2 input
    per_extra_expert = frac * (v3.capacity_factor or 1.0) * routed_copy
    top1 = v3.with_overrides(top_k=1)
    assert _inv(v3) - _inv(top1) == pytest.approx((v3.top_k - 1) * per_extra_expert, rel=1e-9)
