"""Parameter counts and FLOPs against the published closed forms (Narayanan 2021, Korthikanti 2022)."""

from __future__ import annotations

import math

import pytest

from gpufleet.perf.flops import (
    attention_flops_per_token_layer,
    embedding_params,
    gemm_flops_per_token_layer,
    hardware_flops_per_step,
    logit_flops_per_token,
    model_flops_per_step,
    model_flops_per_token,
    param_count,
    params_per_layer,
)
from gpufleet.perf.model_spec import get_model, load_model

GPT_SHAPES = ["gpt-22b", "gpt3-175b", "gpt-1t"]


def _narayanan_params(l: int, h: int, V: int, s: int) -> float:  # noqa: E741 - paper notation
    return 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


def _korthikanti_model_flops(B: int, s: int, l: int, h: int, V: int) -> float:  # noqa: E741
    return 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


def _narayanan_full_recompute_flops(B: int, s: int, l: int, h: int, V: int) -> float:  # noqa: E741
    return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


def test_gpt3_175b_param_count_matches_narayanan() -> None:
    m = get_model("gpt3-175b")
    closed = _narayanan_params(96, 12288, 51200, 2048)
    # Narayanan's form omits the final layernorm (gain + bias, 2h); ours counts it.
    assert param_count(m) == pytest.approx(closed + 2 * 12288, rel=1e-12)
    assert param_count(m) == pytest.approx(closed, rel=1e-4)
    assert param_count(m) == pytest.approx(174.6e9, rel=1e-4)


def test_gpt3_175b_per_layer_and_embedding_by_hand() -> None:
    m = get_model("gpt3-175b")
    h = 12288
    # QKV 3h^2 + out h^2 + MLP 8h^2; biases 3h + h + 4h + h = 9h; two layernorms 4h
    assert params_per_layer(m) == 12 * h * h + 13 * h
    # token embedding Vh + learned positions sh + final layernorm 2h (output tied)
    assert embedding_params(m) == 51200 * h + 2048 * h + 2 * h


@pytest.mark.parametrize("name", ["gpt-1.7b", "gpt-18.4b", "gpt-145.6b", "gpt-529.6b"])
def test_narayanan_table1_param_counts(name: str) -> None:
    m = get_model(name)
    expected_b = float(name.removeprefix("gpt-").removesuffix("b"))
    assert param_count(m) / 1e9 == pytest.approx(expected_b, abs=0.06)
    closed = _narayanan_params(m.layers, m.hidden, m.vocab, m.seq)
    assert param_count(m) == pytest.approx(closed + 2 * m.hidden, rel=1e-12)


def test_llama3_405b_param_count() -> None:
    m = get_model("llama3-405b")
    h, kv, f, V, l = 16384, 8 * 128, 53248, 128256, 126  # noqa: E741
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * f + 2 * h  # q, k+v, o, SwiGLU, two RMSNorms
    assert per_layer == 3_187_703_808
    assert params_per_layer(m) == per_layer
    # untied input embedding and output layer, rope (no position table), final RMSNorm h
    assert embedding_params(m) == 2 * V * h + h
    total = l * per_layer + 2 * V * h + h
    assert param_count(m) == total
    assert 405e9 <= param_count(m) <= 406.5e9


def test_llama2_7b_param_count() -> None:
    # HF reports 6,738,415,616 parameters for Llama-2-7b
    assert param_count(get_model("llama2-7b")) == 6_738_415_616


@pytest.mark.parametrize("name", GPT_SHAPES)
@pytest.mark.parametrize("batch", [1, 512, 1536])
def test_model_flops_match_korthikanti(name: str, batch: int) -> None:
    m = get_model(name)
    expected = _korthikanti_model_flops(batch, m.seq, m.layers, m.hidden, m.vocab)
    assert model_flops_per_step(m, batch) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("name", GPT_SHAPES)
def test_model_flops_other_seq(name: str) -> None:
    m = get_model(name)
    expected = _korthikanti_model_flops(64, 8192, m.layers, m.hidden, m.vocab)
    assert model_flops_per_step(m, 64, seq=8192) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("name", GPT_SHAPES)
def test_full_recompute_hardware_flops_match_narayanan_eq3(name: str) -> None:
    m = get_model(name)
    expected = _narayanan_full_recompute_flops(1024, m.seq, m.layers, m.hidden, m.vocab)
    assert hardware_flops_per_step(m, 1024, recompute="full") == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("name", GPT_SHAPES)
def test_no_recompute_hardware_equals_model(name: str) -> None:
    m = get_model(name)
    assert hardware_flops_per_step(m, 8, recompute="none") == model_flops_per_step(m, 8)


@pytest.mark.parametrize("name", [*GPT_SHAPES, "llama3-70b"])
def test_selective_recompute_adds_attention_core_forward(name: str) -> None:
    m = get_model(name)
    B, s = 16, m.seq
    extra = hardware_flops_per_step(m, B, recompute="selective") - model_flops_per_step(m, B)
    # one forward of Q·K^T and scores·V: 2·s·h + 2·s·h FLOPs per token per layer
    assert extra == pytest.approx(B * s * m.layers * 4 * s * m.hidden, rel=1e-12)


def test_selective_recompute_causal_adds_half_square() -> None:
    m = get_model("gpt3-175b")
    extra = hardware_flops_per_step(m, 4, recompute="selective", causal=True) - model_flops_per_step(m, 4, causal=True)
    assert extra == pytest.approx(4 * 2048 * 96 * 2 * 2048 * 12288, rel=1e-12)


def test_bad_recompute_mode() -> None:
    with pytest.raises(ValueError, match="recompute"):
        hardware_flops_per_step(get_model("gpt3-125m"), 1, recompute="some")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [*GPT_SHAPES, "llama3-8b"])
def test_causal_halves_only_attention(name: str) -> None:
    m = get_model(name)
    B, s, l, h = 32, m.seq, m.layers, m.hidden  # noqa: E741
    full = model_flops_per_step(m, B)
    causal = model_flops_per_step(m, B, causal=True)
    # training attention FLOPs: 3 x (4·s·h) per token per layer; causal keeps half
    attention = 3 * 4 * s * h * l * B * s
    assert full - causal == pytest.approx(attention / 2, rel=1e-12)
    assert attention_flops_per_token_layer(m, s, causal=True) * 2 == attention_flops_per_token_layer(m, s)


def test_per_token_matches_6n_plus_attention_for_gpt() -> None:
    # PaLM-style: 6·N_nonembedding + 12·L·h·s + 6·h·V for the logits (GPT with tied embeddings, no biases counted)
    m = get_model("gpt3-175b")
    l, h, s, V = 96, 12288, 2048, 51200  # noqa: E741
    matmul_params = 12 * l * h * h
    assert model_flops_per_token(m) == 6 * matmul_params + 12 * l * h * s + 6 * h * V


def test_logit_flops() -> None:
    m = get_model("llama3-405b")
    assert logit_flops_per_token(m) == 2 * 16384 * 128256


def test_gqa_lowers_flops_by_kv_projection() -> None:
    mha = load_model(None, layers=32, hidden=4096, heads=32, vocab=32000, seq=4096)
    gqa = mha.with_overrides(kv_heads=8)
    assert gqa.kv_width == 1024
    assert model_flops_per_step(gqa, 8) < model_flops_per_step(mha, 8)
    # K and V projections shrink from h x h to h x (kv·d): 2 matrices x 2 FLOPs x 3 (fwd+bwd)
    saved = 3 * 2 * 2 * 4096 * (4096 - 1024) * 32 * 8 * 4096
    assert model_flops_per_step(mha, 8) - model_flops_per_step(gqa, 8) == pytest.approx(saved, rel=1e-12)
    assert param_count(mha) - param_count(gqa) == 32 * 2 * (4096 * 3072 + 3072)  # weights and biases


def test_glu_uses_three_matrices() -> None:
    h, f = 4096, 11008
    base = load_model(None, layers=2, hidden=h, heads=32, vocab=1000, ffn_hidden=f)
    glu = base.with_overrides(glu=True)
    attn_part = 2 * (3 * h * h + h * h)
    mlp_plain = gemm_flops_per_token_layer(base) - attn_part
    mlp_glu = gemm_flops_per_token_layer(glu) - attn_part
    assert mlp_plain == 2 * 2 * h * f
    assert mlp_glu == 2 * 3 * h * f
    assert mlp_glu / mlp_plain == pytest.approx(1.5)


def test_ffn_default_is_four_h() -> None:
    m = load_model(None, layers=2, hidden=512, heads=8, vocab=100)
    explicit = m.with_overrides(ffn_hidden=2048)
    assert gemm_flops_per_token_layer(m) == gemm_flops_per_token_layer(explicit) == 2 * 12 * 512 * 512


def test_llama3_405b_flops_per_token_from_research_notes() -> None:
    # perfmodel.md §3.1: about 2.63e12 FLOP/token at s = 8192 (6N = 2.43e12)
    m = get_model("llama3-405b")
    assert model_flops_per_token(m) == pytest.approx(2.63e12, rel=0.01)
    assert 6 * param_count(m) == pytest.approx(2.43e12, rel=0.01)
    assert math.isclose(model_flops_per_step(m, 2) / (2 * 8192), model_flops_per_token(m), rel_tol=1e-12)
