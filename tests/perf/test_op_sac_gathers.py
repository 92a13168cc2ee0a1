"""torchtitan's per-op selective checkpointing saves matmul outputs and reduce-scatters, not all-gathers, so the
backward gathers the sequence-parallel matmul inputs again: more TP traffic than attention-core recompute."""

from __future__ import annotations

import numpy as np

from gpufleet.perf.model_spec import load_model
from gpufleet.perf.options import Layout, TrainOptions
from gpufleet.perf.step import estimate_step
from gpufleet.perf.system import System


def _tp_comm(policy: str, recompute: str, tp: int = 8, sp: bool = True) -> float:
    model, system = load_model("llama3-8b"), System.build("h100", "ib-ndr")
    opts = TrainOptions(sequence_parallel=sp, selective_policy=policy)
    layout = Layout(tp=tp, pp=1, dp=64 // tp, mbs=1, recompute=recompute)
    est = estimate_step(model, system, layout, 64, options=opts)
    return float(est.to_dict()["breakdown"]["tp_comm"])


def test_op_policy_regathers_sequence_parallel_inputs() -> None:
    op, attn = _tp_comm("op", "selective"), _tp_comm("attention", "selective")
    assert np.isclose(op / attn, 5.0 / 4.0)  # four all-reduce equivalents per layer, plus the two gathers


def test_only_selective_recompute_with_sequence_parallelism_pays_it() -> None:
    assert np.isclose(_tp_comm("op", "none"), _tp_comm("attention", "none"))
    assert np.isclose(_tp_comm("op", "full"), _tp_comm("attention", "full"))
    assert np.isclose(_tp_comm("op", "selective", sp=False), _tp_comm("attention", "selective", sp=False))
