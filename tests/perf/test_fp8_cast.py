"""fp8 dynamic-scaling casts: memory-bound, so narrow (tensor-parallel) fp8 GEMMs keep less of their speed-up."""

from __future__ import annotations

import numpy as np

from gpufleet.perf.efficiency import Efficiency, default_efficiency
from gpufleet.perf.gemm_io import fp8_cast_elements_per_token_layer
from gpufleet.perf.model_spec import load_model
from gpufleet.perf.options import Layout, TrainOptions
from gpufleet.perf.step import estimate_step
from gpufleet.perf.system import System


def _with_cast(eff: Efficiency, nbytes: float) -> Efficiency:
    data = eff.model_dump()
    data["compute"]["hopper"]["fp8_cast_bytes"] = nbytes
    return Efficiency.model_validate(data)


def _step(tp: int, precision: str, eff: Efficiency) -> float:
    model, system = load_model("llama3-8b"), System.build("h100", "ib-ndr")
    layout = Layout(tp=tp, pp=1, dp=64 // tp, mbs=2)
    opts = TrainOptions(precision=precision, sequence_parallel=tp > 1)
    return estimate_step(model, system, layout, 128, options=opts, efficiency=eff).step_time_s


def test_cast_elements_keep_the_full_width_operands_as_tp_grows() -> None:
    model = load_model("llama3-8b")
    f1, b1 = fp8_cast_elements_per_token_layer(model, 1)
    f8, b8 = fp8_cast_elements_per_token_layer(model, 8)
    # the GEMM FLOPs on a rank fall 8x from TP1 to TP8; the casts of full-width operands do not
    assert float(f8) > float(f1) / 8 * 2 and float(b8) > float(b1) / 8 * 2
    assert float(f8) < float(f1) and float(b8) < float(b1)


def test_fp8_speed_up_shrinks_with_tp_and_bf16_is_untouched() -> None:
    eff = default_efficiency()
    free, costly = _with_cast(eff, 0.0), _with_cast(eff, 4.0)
    for tp in (1, 8):
        assert np.isclose(_step(tp, "bf16", free), _step(tp, "bf16", costly))
        assert _step(tp, "fp8", costly) > _step(tp, "fp8", free)
    gain = {tp: _step(tp, "bf16", costly) / _step(tp, "fp8", costly) for tp in (1, 8)}
    assert gain[8] < gain[1]
    # the cast's share of an fp8 step grows with TP
    share = {tp: 1 - _step(tp, "fp8", free) / _step(tp, "fp8", costly) for tp in (1, 8)}
    assert share[8] > share[1]


def test_the_simulators_frozen_constants_have_no_cast_cost() -> None:
    from gpufleet.perf.efficiency import jobspeed_efficiency

    assert all(c.fp8_cast_bytes == 0.0 for c in jobspeed_efficiency().compute.values())
