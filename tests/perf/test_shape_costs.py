"""Revision 3's shape costs from published kernel benchmarks, and torchtitan's pipeline micro-batching."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.perf.efficiency import default_efficiency
from gpufleet.perf.gemm_io import flash_length_efficiency, gemm_output_bytes_per_token_layer
from gpufleet.perf.ground_truth import read_cases
from gpufleet.perf.model_spec import get_model
from gpufleet.perf.options import TrainOptions
from gpufleet.perf.step import evaluate
from gpufleet.perf.system import System


def _deepgemm_tflops(n: int, k: int, m: int = 4096) -> float:
    """The published DeepGEMM rate (H800, fp8) explained as large-shape compute plus the bf16 output written."""
    large = 1520e12  # its M = 4,096, N = 7,168, K = 16,384 row: the compute-bound rate
    bw = 3.35e12  # H800 HBM3
    flops = 2.0 * m * n * k
    seconds = flops / large + (2.0 * m * n + m * k + k * n) / bw
    return flops / seconds / 1e12


@pytest.mark.parametrize(("n", "k", "published"), [(32768, 512, 775.0), (7168, 2048, 1168.0)])
def test_output_writes_explain_deepgemms_short_k_rows(n: int, k: int, published: float) -> None:
    assert _deepgemm_tflops(n, k) == pytest.approx(published, rel=0.02)


def test_row_parallel_outputs_keep_their_width_under_tensor_parallelism() -> None:
    llama = get_model("llama3-70b")
    fwd1, _ = gemm_output_bytes_per_token_layer(llama, 1)
    fwd8, bwd8 = gemm_output_bytes_per_token_layer(llama, 8)
    # eight-way TP divides the FLOPs by 8 but not the bytes: the attention output and MLP down write full width
    assert float(fwd1) / 8 < float(fwd8) < float(fwd1)
    assert float(bwd8) > 2 * 2.0 * llama.hidden  # two full-width input gradients per layer at least


def test_flash_length_curve_follows_the_published_sweep() -> None:
    fa2 = {512: 329.0, 1024: 390.0, 2048: 434.0, 4096: 458.0}  # TFLOPS, non-causal, vs 477 at 16K
    for seq, tflops in fa2.items():
        rel = flash_length_efficiency(seq, causal=False) / flash_length_efficiency(16384, causal=False)
        assert rel == pytest.approx(tflops / 477.0, abs=0.03)
    assert flash_length_efficiency(4096, causal=True) < flash_length_efficiency(4096, causal=False)
    assert flash_length_efficiency(65536, causal=True, window=4096) == flash_length_efficiency(8192, causal=True)


def test_narrow_gemms_cost_more_per_flop_than_wide_ones() -> None:
    system = System.build("h100", "ib-ndr")
    model = get_model("llama3-70b")
    eff = default_efficiency()
    out = evaluate(
        model, system, 64, tp=np.array([1.0, 8.0]), pp=1, dp=1, seq=8192, options=TrainOptions(), efficiency=eff
    )
    compute = np.asarray(out["compute"])
    # per GPU, TP8 does an eighth of the FLOPs but writes full-width outputs: more than an eighth of the time
    assert compute[1] > compute[0] / 8 * 1.01


def test_torchtitan_pipelines_split_the_local_batch_into_one_micro_batch_per_stage() -> None:
    cases, _ = read_cases()
    pipelined = [c for c in cases if c.group.startswith("torchtitan") and c.pp > 1]
    assert pipelined
    for case in pipelined:
        assert case.mbs == (case.gbs // (case.dp * case.pp),)  # torchtitan's default: micro-batches = PP degree
        assert case.vp in ((1,), (2,))  # interleaved schedules take two stages per rank


def test_interleaved_layouts_have_micro_batches_in_multiples_of_the_pipeline_depth() -> None:
    from gpufleet.perf.planner import plan_layouts

    system = System.build("a100-80g", "ib-hdr")
    plan = plan_layouts(get_model("gpt3-175b"), system, 1024, 768, seq=2048, top=200)
    inter = plan.table.filter(plan.table["vp"] > 1)
    assert inter.height
    for r in inter.iter_rows(named=True):
        assert (768 // (r["dp"] * r["mbs"])) % r["pp"] == 0


def test_overlapped_gradient_traffic_also_hides_in_the_pipeline_bubble() -> None:
    system = System.build("h100", "roce-400g")
    eff3 = default_efficiency()
    eff2 = eff3.model_copy(update={"software": eff3.software.model_copy(update={"revision": 2})})
    layout = {"tp": 8, "pp": 16, "dp": 64, "vp": 1}
    opts = TrainOptions(dp_overlap=True, zero=1)
    model = get_model("llama3-405b")
    exposed = [
        float(evaluate(model, system, 2048, seq=8192, options=opts, efficiency=e, **layout)["dp_comm_exposed"])
        for e in (eff2, eff3)
    ]
    assert exposed[1] < exposed[0]


def test_deepseek_v3s_mtp_module_loads_the_last_stage() -> None:
    system = System.build("h800", "ib-ndr")
    with_mtp = get_model("deepseek-v3")
    assert with_mtp.mtp_depth == 1
    without = with_mtp.with_overrides(mtp_depth=0)
    opts = TrainOptions(precision="fp8", ep_overlap=True)
    layout = {"tp": 1, "pp": 16, "dp": 128, "ep": 64}
    t = [
        float(evaluate(m, system, 15360, seq=4096, options=opts, **layout)["step_time_s"]) for m in (without, with_mtp)
    ]
    assert t[1] > t[0]
