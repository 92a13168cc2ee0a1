"""Revision 2's GEMM roofline and Llama 3's edge chunks: what keeps the planner off exotic small-chunk layouts."""

from __future__ import annotations

import pytest

from gpufleet.perf.efficiency import default_efficiency
from gpufleet.perf.model_spec import get_model
from gpufleet.perf.options import TrainOptions
from gpufleet.perf.planner import plan_layouts
from gpufleet.perf.step import evaluate
from gpufleet.perf.system import System


@pytest.fixture(scope="module")
def h100() -> System:
    return System.build("h100", "roce-400g")


def _compute(system: System, revision: int, **layout: int) -> float:
    eff = default_efficiency()
    eff = eff.model_copy(update={"software": eff.software.model_copy(update={"revision": revision})})
    out = evaluate(
        get_model("llama3-405b"), system, 2048, seq=8192, options=TrainOptions(zero=2), efficiency=eff, **layout
    )
    return float(out["compute"])


def test_short_chunks_stream_weights_wide_ones_do_not(h100: System) -> None:
    short = {"tp": 1, "pp": 64, "dp": 4, "cp": 32}  # 256 tokens per rank and micro-batch
    wide = {"tp": 8, "pp": 16, "dp": 64, "cp": 1, "vp": 4}  # 8,192 tokens: compute-bound
    assert _compute(h100, 2, **short) > 1.3 * _compute(h100, 1, **short)
    assert _compute(h100, 2, **wide) == pytest.approx(_compute(h100, 1, **wide), rel=1e-9)


def test_planner_leaves_256_token_context_chunks_for_llama3_405b(h100: System) -> None:
    plan = plan_layouts(get_model("llama3-405b"), h100, 8192, 2048, seq=8192, options=TrainOptions(zero=2), top=3)
    best = plan.table.row(0, named=True)
    assert 8192 // best["cp"] >= 1024


def test_planner_offers_embedding_only_and_output_only_chunks(h100: System) -> None:
    plan = plan_layouts(get_model("llama3-405b"), h100, 8192, 2048, seq=8192, options=TrainOptions(zero=2), top=500)
    t = plan.table
    assert ((t["pp"] == 16) & (t["vp"] == 8)).any()  # 126 layers in 16 x 8 chunks, as Llama 3 trained
