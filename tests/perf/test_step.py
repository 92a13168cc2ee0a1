"""Step-time model: breakdown consistency, pipeline bubble, MFU, layout checks and known memory facts.

Most tests pin their own ``Efficiency`` (the pre-calibration physical estimates) so that refitting the
shipped ``perf_efficiency.toml`` cannot change what they check; the memory facts are also run against
the shipped constants, which they do not depend on beyond the per-GPU reserve.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.errors import ConfigError
from gpufleet.perf.efficiency import Efficiency, default_efficiency
from gpufleet.perf.flops import hardware_flops_per_step, model_flops_per_step, param_count, params_per_layer
from gpufleet.perf.model_spec import get_model
from gpufleet.perf.options import Layout, TrainOptions
from gpufleet.perf.step import BREAKDOWN_KEYS, estimate_step, evaluate, layout_problems
from gpufleet.perf.system import System

# The pre-calibration physical estimates; fields the shipped file adds later keep their shipped values.
_PINNED = {
    "compute": {
        "ampere": {
            "gemm": 0.80,
            "gemm_half_width": 96,
            "attention": 0.45,
            "flash_attention": 0.55,
            "elementwise_bytes": 40,
            "memory": 0.80,
            "fp8_gemm": 0.0,
        },
        "hopper": {
            "gemm": 0.75,
            "gemm_half_width": 160,
            "attention": 0.35,
            "flash_attention": 0.50,
            "elementwise_bytes": 40,
            "memory": 0.80,
            "fp8_gemm": 0.55,
        },
        "default": {
            "gemm": 0.70,
            "gemm_half_width": 96,
            "attention": 0.35,
            "flash_attention": 0.45,
            "elementwise_bytes": 40,
            "memory": 0.75,
            "fp8_gemm": 0.5,
        },
    },
    "intra": {"nvlink": 0.75, "pcie": 0.80, "alpha_us": 10.0},
    "network": {
        "infiniband": {"efficiency": 0.90, "alpha_us": 15.0},
        "roce": {"efficiency": 0.85, "alpha_us": 20.0},
        "ethernet": {"efficiency": 0.60, "alpha_us": 60.0},
    },
    "software": {
        "tp_overlap_exposed": 0.25,
        "pp_overlap_exposed": 0.25,
        "dp_overlap_window": 1.0,
        "fused_elementwise": 0.5,
        "step_overhead_s": 0.02,
        "memory_reserve_gb": 3.0,
    },
}


def _merge(shipped: dict, pinned: dict) -> dict:
    out = dict(shipped)
    for key, value in pinned.items():
        if isinstance(value, dict) and isinstance(shipped.get(key), dict):
            out[key] = _merge(shipped[key], value)
        elif key in shipped:
            out[key] = value
    return out


FIXED = Efficiency.model_validate(_merge(default_efficiency().model_dump(), _PINNED))

A100_PEAK = 312e12


@pytest.fixture(scope="module")
def a100() -> System:
    return System.build("a100-80g", "ib-hdr")


@pytest.fixture(scope="module")
def a100_roce() -> System:
    return System.build("a100-80g", "roce-200g")


def _est(model: str, system: System, layout: Layout, gbs: int, options: TrainOptions | None = None, eff=FIXED):
    return estimate_step(get_model(model), system, layout, gbs, options=options, efficiency=eff)


CASES = [
    ("gpt3-175b", Layout(tp=8, pp=8, dp=16, recompute="selective"), 1536, TrainOptions()),
    ("gpt3-175b", Layout(tp=8, pp=8, dp=16, vp=6, recompute="selective"), 768, TrainOptions.megascale()),
    ("gpt3-175b", Layout(tp=8, pp=1, dp=8), 64, TrainOptions(zero=0)),
    ("llama3-70b", Layout(tp=8, pp=4, dp=4, recompute="full"), 256, TrainOptions(zero=3)),
    ("gpt3-1.3b", Layout(recompute="full"), 8, TrainOptions(flash_attention=False, sequence_parallel=False)),
    ("llama2-7b", Layout(tp=2, dp=4, mbs=2), 64, TrainOptions(zero=2, causal_flops=True)),
]


@pytest.mark.parametrize(("model", "layout", "gbs", "options"), CASES)
def test_breakdown_sums_to_step_time(a100: System, model: str, layout: Layout, gbs: int, options: TrainOptions) -> None:
    est = _est(model, a100, layout, gbs, options)
    breakdown = est.to_dict()["breakdown"]
    assert tuple(breakdown) == BREAKDOWN_KEYS
    assert all(v >= 0 for v in breakdown.values())
    assert sum(breakdown.values()) == pytest.approx(est.step_time_s, rel=1e-12)
    assert est.values["microbatches"] == gbs / (layout.dp * layout.mbs)


@pytest.mark.parametrize(("model", "layout", "gbs", "options"), CASES)
def test_mfu_hfu_and_throughput_consistent(
    a100: System, model: str, layout: Layout, gbs: int, options: TrainOptions
) -> None:
    est = _est(model, a100, layout, gbs, options)
    m = get_model(model)
    step, n = est.step_time_s, layout.gpus
    flops = model_flops_per_step(m, gbs, causal=options.causal_flops)
    assert est.values["mfu"] == pytest.approx(flops / (step * n * A100_PEAK), rel=1e-9)
    hw = hardware_flops_per_step(m, gbs, recompute=layout.recompute, causal=options.causal_flops)
    assert est.values["hfu"] == pytest.approx(hw / (step * n * A100_PEAK), rel=1e-9)
    assert est.values["tokens_per_s"] == pytest.approx(gbs * m.seq / step, rel=1e-12)
    assert 0 < est.values["mfu"] <= est.values["hfu"] < 1
    d = est.to_dict()
    assert d["tokens_per_s_per_gpu"] == pytest.approx(d["tokens_per_s"] / n)
    assert d["model_tflops_per_gpu"] == pytest.approx(est.values["mfu"] * 312)


@pytest.mark.parametrize(("vp", "gbs"), [(1, 1536), (4, 1536), (1, 768), (4, 384)])
def test_pipeline_bubble_fraction(a100: System, vp: int, gbs: int) -> None:
    layout = Layout(tp=8, pp=8, dp=16, vp=vp, recompute="selective")
    est = _est("gpt3-175b", a100, layout, gbs)
    v = est.values
    m = gbs / (16 * 1)
    assert v["microbatches"] == m
    assert v["pp_bubble"] / (v["compute"] + v["tp_comm"]) == pytest.approx((8 - 1) / (vp * m), rel=1e-12)


def test_no_bubble_without_pipeline(a100: System) -> None:
    v = _est("gpt3-13b", a100, Layout(tp=8, dp=8), 512).values
    assert v["pp_bubble"] == 0.0
    assert v["pp_comm"] == 0.0


def test_interleaving_shrinks_bubble(a100: System) -> None:
    base = _est("gpt3-175b", a100, Layout(tp=8, pp=8, dp=16, recompute="selective"), 1536).values
    inter = _est("gpt3-175b", a100, Layout(tp=8, pp=8, dp=16, vp=4, recompute="selective"), 1536).values
    assert inter["pp_bubble"] == pytest.approx(base["pp_bubble"] / 4, rel=1e-12)
    assert inter["pp_comm"] > base["pp_comm"]  # v x more send/recv


def test_memory_states_by_hand_175b_zero0(a100: System) -> None:
    # TP8 PP1 DP8, plain DP: all 174.6e9 parameters (one stage holds every embedding) / 8 ranks x 18 bytes
    est = _est("gpt3-175b", a100, Layout(tp=8, pp=1, dp=8), 64, TrainOptions(zero=0))
    m = get_model("gpt3-175b")
    states = (96 * params_per_layer(m) + 51200 * 12288 + 2048 * 12288 + 2 * 12288) / 8 * 18
    assert est.values["memory_states_gb"] * 2**30 == pytest.approx(states, rel=1e-12)
    assert est.values["memory_states_gb"] == pytest.approx(393e9 / 2**30, abs=1)  # GiB


@pytest.mark.parametrize("eff", [FIXED, None], ids=["fixed", "shipped"])
def test_gpt3_175b_tp8_dp8_zero0_does_not_fit(a100: System, eff: Efficiency | None) -> None:
    est = _est("gpt3-175b", a100, Layout(tp=8, pp=1, dp=8), 64, TrainOptions(zero=0), eff)
    assert not est.fits
    assert est.values["memory_gb"] > 360  # GiB: 393 GB of states alone
    assert est.to_dict()["fits_in_memory"] is False


@pytest.mark.parametrize("eff", [FIXED, None], ids=["fixed", "shipped"])
def test_gpt3_175b_megatron_layout_fits(a100: System, eff: Efficiency | None) -> None:
    layout = Layout(tp=8, pp=8, dp=16, mbs=1, recompute="selective")
    est = _est("gpt3-175b", a100, layout, 1536, TrainOptions(zero=1), eff)
    assert est.fits
    # states: 12 layers + embedding per stage / 8 x (6 + 12/16) bytes ~ 18.9 GB
    m = get_model("gpt3-175b")
    states = (12 * params_per_layer(m) + 51200 * 12288) / 8 * (6 + 12 / 16)
    unit = 2**30 if (eff or default_efficiency()).software.revision >= 2 else 1e9  # revision 2 counts GiB
    assert est.values["memory_states_gb"] * unit == pytest.approx(states, rel=1e-12)
    assert 20 < est.values["memory_gb"] < 80


@pytest.mark.parametrize("eff", [FIXED, None], ids=["fixed", "shipped"])
def test_llama2_7b_plain_adam_on_one_gpu_does_not_fit(a100: System, eff: Efficiency | None) -> None:
    est = _est("llama2-7b", a100, Layout(recompute="full"), 8, TrainOptions(zero=0), eff)
    assert not est.fits
    assert est.values["memory_states_gb"] > 7e9 * 18 / 2**30 * 0.9  # about 121 GB (113 GiB) of weights + Adam


@pytest.mark.parametrize("eff", [FIXED, None], ids=["fixed", "shipped"])
def test_gpt3_1_3b_on_one_gpu_fits(a100: System, eff: Efficiency | None) -> None:
    est = _est("gpt3-1.3b", a100, Layout(recompute="full"), 8, None, eff)
    assert est.fits
    assert est.values["memory_states_gb"] == pytest.approx(18 * param_count(get_model("gpt3-1.3b")) / 2**30, rel=0.01)


def test_single_stage_states_cover_all_params_untied(a100: System) -> None:
    m = get_model("llama2-7b")
    est = _est("llama2-7b", a100, Layout(), 8, TrainOptions(zero=0))
    assert est.values["memory_states_gb"] * 2**30 == pytest.approx(18 * param_count(m), rel=1e-3)


def test_recompute_trades_memory_for_time(a100: System) -> None:
    base = dict(tp=8, pp=8, dp=16)
    results = {
        mode: _est("gpt3-175b", a100, Layout(**base, recompute=mode), 1536, TrainOptions(flash_attention=False)).values
        for mode in ("none", "selective", "full")
    }
    mem = [results[k]["memory_activations_gb"] for k in ("none", "selective", "full")]
    time = [results[k]["step_time_s"] for k in ("none", "selective", "full")]
    assert mem[0] > mem[1] > mem[2]
    assert time[0] < time[1] < time[2]


def test_megascale_reduces_step_time(a100_roce: System) -> None:
    layout = Layout(tp=8, pp=8, dp=16, vp=6, recompute="selective")
    base = _est("gpt3-175b", a100_roce, layout, 768, TrainOptions()).values
    fast = _est("gpt3-175b", a100_roce, layout, 768, TrainOptions.megascale()).values
    assert fast["step_time_s"] < base["step_time_s"]
    assert fast["mfu"] > base["mfu"]
    for key in ("tp_comm", "pp_comm", "dp_comm_exposed", "compute"):
        assert fast[key] < base[key], key
    # TP: half the collectives (parallel block), a quarter of them exposed
    assert fast["tp_comm"] == pytest.approx(base["tp_comm"] * 0.5 * 0.25, rel=1e-12)
    assert fast["pp_comm"] == pytest.approx(base["pp_comm"] * 0.25, rel=1e-12)


def test_megascale_never_slower_with_shipped_constants(a100_roce: System) -> None:
    layout = Layout(tp=8, pp=8, dp=16, vp=6, recompute="selective")
    base = _est("gpt3-175b", a100_roce, layout, 768, TrainOptions(), None).values
    fast = _est("gpt3-175b", a100_roce, layout, 768, TrainOptions.megascale(), None).values
    assert fast["step_time_s"] < base["step_time_s"]
    for key in BREAKDOWN_KEYS:
        assert fast[key] <= base[key] * (1 + 1e-12), key
    assert default_efficiency().software.tp_overlap_exposed <= 1


def test_evaluate_vectorised_matches_estimate_step(a100: System) -> None:
    m = get_model("gpt3-175b")
    tp = np.array([4, 8, 8])
    pp = np.array([16, 8, 4])
    dp = np.array([16, 16, 32])
    rc = np.array([2, 1, 0])
    out = evaluate(m, a100, 1024, tp, pp, dp, recompute=rc, efficiency=FIXED)
    assert out["step_time_s"].shape == (3,)
    for i, mode in enumerate(("full", "selective", "none")):
        single = _est("gpt3-175b", a100, Layout(tp=int(tp[i]), pp=int(pp[i]), dp=int(dp[i]), recompute=mode), 1024)
        for key in ("step_time_s", "memory_gb", "mfu", *BREAKDOWN_KEYS):
            assert out[key][i] == pytest.approx(single.values[key], rel=1e-12), key


def test_seq_override_scales_tokens(a100: System) -> None:
    m = get_model("gpt3-1.3b")
    est = estimate_step(m, a100, Layout(dp=8), 64, seq=4096, efficiency=FIXED)
    assert est.seq == 4096
    assert est.values["mfu"] * est.step_time_s * 8 * A100_PEAK == pytest.approx(
        model_flops_per_step(m, 64, seq=4096), rel=1e-9
    )


def test_fp8_on_ampere_is_config_error(a100: System) -> None:
    with pytest.raises(ConfigError, match="fp8"):
        _est("gpt3-1.3b", a100, Layout(), 8, TrainOptions(precision="fp8"))


def test_default_precision_on_v100_falls_back_to_fp16_peak() -> None:
    # V100 has no bf16: the default (bf16) options train in fp16 against the 125 TFLOP/s fp16 peak
    system = System.build("v100", "ib-edr")
    est = _est("gpt3-1.3b", system, Layout(), 8)
    m = get_model("gpt3-1.3b")
    assert est.values["mfu"] == pytest.approx(model_flops_per_step(m, 8) / (est.step_time_s * 125e12), rel=1e-9)


def test_fp16_on_v100_works() -> None:
    system = System.build("v100", "ib-edr")
    est = _est("gpt3-1.3b", system, Layout(), 8, TrainOptions(precision="fp16"))
    m = get_model("gpt3-1.3b")
    assert est.values["mfu"] == pytest.approx(model_flops_per_step(m, 8) / (est.step_time_s * 125e12), rel=1e-9)


# --- layout_problems ---


def test_valid_layout_has_no_problems() -> None:
    m = get_model("gpt3-175b")
    assert layout_problems(m, 1024, 1536, Layout(tp=8, pp=8, dp=16, vp=6)) == []


def test_tp_must_divide_heads() -> None:
    m = get_model("gpt3-175b")  # 96 heads
    problems = layout_problems(m, 1280, 1280, Layout(tp=5, pp=8, dp=32))
    assert len(problems) == 1
    assert "TP=5" in problems[0] and "96" in problems[0]


def test_product_must_equal_gpus() -> None:
    m = get_model("gpt3-175b")
    problems = layout_problems(m, 1024, 1536, Layout(tp=8, pp=8, dp=8))
    assert len(problems) == 1
    assert "512" in problems[0] and "1024" in problems[0]


def test_gbs_must_divide_by_dp_times_mbs() -> None:
    m = get_model("gpt3-175b")
    problems = layout_problems(m, 1024, 1000, Layout(tp=8, pp=8, dp=16, mbs=2))
    assert len(problems) == 1
    assert "1000" in problems[0] and "32" in problems[0]
    assert layout_problems(m, 1024, 1024, Layout(tp=8, pp=8, dp=16, mbs=2)) == []


def test_virtual_stages_need_pipeline() -> None:
    m = get_model("gpt3-175b")
    problems = layout_problems(m, 64, 64, Layout(tp=8, dp=8, vp=2))
    assert any("PP > 1" in p for p in problems)


def test_virtual_stages_cannot_exceed_layers() -> None:
    m = get_model("gpt3-175b")  # 96 layers; 8 x 16 = 128 chunks is more than there are layers
    problems = layout_problems(m, 512, 512, Layout(tp=8, pp=8, dp=8, vp=16))
    assert len(problems) == 1 and "128" in problems[0]
    # uneven splits are allowed: 8 x 5 = 40 chunks of ceil(96 / 40) = 3 layers
    assert layout_problems(m, 512, 512, Layout(tp=8, pp=8, dp=8, vp=5)) == []


def test_uneven_pipeline_uses_ceil_layers_per_stage(a100: System) -> None:
    m = get_model("gpt3-175b")
    even = _est("gpt3-175b", a100, Layout(tp=8, pp=8, dp=8), 512).values  # 12 layers per stage
    uneven = _est("gpt3-175b", a100, Layout(tp=8, pp=7, dp=8), 448).values  # ceil(96 / 7) = 14 layers
    ppl, emb = params_per_layer(m), 51200 * 12288
    ratio = (14 * ppl + emb) / (12 * ppl + emb)
    assert uneven["memory_states_gb"] / even["memory_states_gb"] == pytest.approx(ratio, rel=1e-12)


def test_pp_cannot_exceed_layers_and_cp_must_divide_seq() -> None:
    m = get_model("gpt3-125m")  # 12 layers, seq 2048
    assert any("exceeds" in p for p in layout_problems(m, 16, 16, Layout(pp=16)))
    assert any("CP=3" in p for p in layout_problems(m, 3, 3, Layout(cp=3)))


def test_several_problems_reported_together() -> None:
    m = get_model("gpt3-175b")
    problems = layout_problems(m, 100, 7, Layout(tp=5, dp=2, vp=2))
    assert len(problems) == 4  # gpus, heads, vp without pp, gbs


def test_estimate_step_rejects_invalid_layout(a100: System) -> None:
    with pytest.raises(ConfigError, match="TP=5"):
        _est("gpt3-175b", a100, Layout(tp=5, dp=2), 8)
    # check=False scores it anyway
    est = estimate_step(get_model("gpt3-175b"), a100, Layout(tp=5, dp=2), 8, efficiency=FIXED, check=False)
    assert est.step_time_s > 0


def test_context_parallel_pays_for_its_kv_all_gather(a100: System) -> None:
    # Llama-3 70B (GQA: 8 K/V heads of 128) at 32k tokens: CP splits the sequence, and every layer all-gathers K and V
    # over the CP group (forward) and reduce-scatters their gradients (backward); one node holds TP8, so CP peers
    # are on other nodes and the exchange crosses the NIC
    opts = TrainOptions(causal_flops=True)
    no_cp = _est("llama3-70b", a100, Layout(tp=8, pp=4, dp=4, recompute="full"), 64, opts)
    with_cp = _est("llama3-70b", a100, Layout(tp=8, pp=4, dp=2, cp=2, recompute="full"), 64, opts)
    assert no_cp.values["cp_comm"] == 0.0
    assert with_cp.values["cp_comm"] > 0.0
    m = get_model("llama3-70b")
    layers = m.layers / 4  # per pipeline stage
    kv = 2 * m.seq * m.kv_width * 2 / 8  # K and V of the whole sequence, one TP rank's share, bf16
    link = FIXED.for_nic(a100.nic)
    # a 2-rank ring all-gather: one step moving half of it; full recompute gathers a third time
    one = (kv / 2) / (a100.nic_bytes_per_gpu * link.efficiency) + link.alpha_us * 1e-6
    assert with_cp.values["cp_comm"] == pytest.approx(with_cp.values["microbatches"] * layers * 3 * one, rel=1e-9)


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_pipeline_send_is_split_across_tensor_parallel_ranks(a100: System, sequence_parallel: bool) -> None:
    # TP8 PP8 DP16: stage neighbours sit 128 GPUs apart, so each send crosses the NIC. Each TP rank sends its
    # 1/8 slice of the (seq x hidden) bf16 activation; without sequence parallelism (Megatron's scatter/gather,
    # Narayanan 2021 section 4.1) the receiving node then all-gathers the slices over NVLink.
    options = TrainOptions(sequence_parallel=sequence_parallel)
    v = _est("gpt3-175b", a100, Layout(tp=8, pp=8, dp=16, recompute="selective"), 1536, options).values
    m = 1536 / 16
    act = 2048 * 12288 * 2.0
    nic_bw = a100.nic_bytes_per_gpu * FIXED.network["infiniband"].efficiency
    intra_bw = a100.intra_node_bytes_per_s * FIXED.intra.nvlink
    send = act / 8 / nic_bw + FIXED.network["infiniband"].alpha_us * 1e-6
    gather = 0.0 if sequence_parallel else 7 / 8 * act / intra_bw + 7 * FIXED.intra.alpha_us * 1e-6
    assert v["pp_comm"] == pytest.approx(2 * (m + 7) * (send + gather), rel=1e-9)


def test_empty_pipeline_slots_go_to_the_last_stage(a100: System) -> None:
    # Llama 3 405B (126 layers) at PP16 x VP4 has room for 128: like Llama 3 (section 3.3.2), the last stage,
    # which also runs the output layer over a 128K vocabulary, holds the two empty slots, so the slowest stage
    # is either a full middle stage or the lightened last one, never a full stage plus the output layer.
    m = get_model("llama3-405b")
    kw = dict(tp=8, pp=16, dp=8, vp=4, recompute=0, options=TrainOptions(), efficiency=FIXED)
    v = evaluate(m, a100, 1024, **kw)
    layer, logits = float(v["layer_s"]), float(v["logits_s"])
    assert 0.5 < logits / layer < 2.0  # the lightened last stage is not the slowest
    t_mb = (v["compute"] + v["tp_comm"]) / v["microbatches"]
    assert float(t_mb) == pytest.approx(max(8 * layer, 6 * layer + logits), rel=1e-9)
    # 94 GPT-3 layers at PP8 leave two slots: the last stage runs 10 layers and the output layer, under 12 layers
    g = evaluate(
        get_model("gpt3-175b").model_copy(update={"layers": 94}),
        a100,
        1536,
        tp=8,
        pp=8,
        dp=16,
        vp=1,
        recompute=1,
        options=TrainOptions(),
        efficiency=FIXED,
    )
    g_mb = (g["compute"] + g["tp_comm"]) / g["microbatches"]
    assert float(g_mb) == pytest.approx(
        max(12 * float(g["layer_s"]), 10 * float(g["layer_s"]) + float(g["logits_s"])), rel=1e-9
    )
    # with no empty slot (128 layers), the last stage carries all eight layers and the output layer
    full = evaluate(m.model_copy(update={"layers": 128}), a100, 1024, **kw)
    t_full = (full["compute"] + full["tp_comm"]) / full["microbatches"]
    assert float(t_full) == pytest.approx(8 * float(full["layer_s"]) + float(full["logits_s"]), rel=1e-9)
    assert float(t_full) > float(t_mb)
