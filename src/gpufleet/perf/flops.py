"""Parameter counts and FLOPs of a transformer, with the two published conventions kept apart.

*Model FLOPs* (what MFU divides by) count the matrix multiplies a training step needs once: forward
plus a backward of twice the forward, attention scores over the full ``s x s`` square unless
``causal=True`` (Megatron r0.8, Korthikanti 2022, MegaScale, PaLM's ``6N + 12·L·h·s`` all count the
full square; Megatron main since 2025 halves it). For GPT with a 4h MLP this is Korthikanti's
``72·B·s·l·h²·(1 + s/6h + V/12lh)``.

*Hardware FLOPs* (what HFU divides by) add what recomputation executes again: the whole forward of
every layer with full recompute (Narayanan 2021 eq. 3, ``96·B·s·l·h²(1 + s/6h + V/16lh)``), or the
attention core's forward with selective recompute.
"""

from __future__ import annotations

from typing import Literal

from gpufleet.perf.model_spec import ModelSpec

__all__ = [
    "RECOMPUTE_MODES",
    "Recompute",
    "active_params",
    "attention_flops_per_token_layer",
    "embedding_params",
    "expert_gemm_flops_per_token_layer",
    "expert_params_per_layer",
    "gemm_flops_per_token_layer",
    "hardware_flops_per_step",
    "logit_flops_per_token",
    "model_flops_per_step",
    "model_flops_per_token",
    "param_count",
    "params_per_layer",
]

Recompute = Literal["none", "selective", "full"]
#: Recompute modes in the order the vectorised code encodes them (0, 1, 2).
RECOMPUTE_MODES: tuple[Recompute, ...] = ("none", "selective", "full")


def _attention_params(model: ModelSpec) -> int:
    """Weights of one attention block's projections (Q, K, V, output; MLA's down/up projections)."""
    h, kv = model.hidden, model.kv_width
    if not model.is_mla:
        return h * (h + 2 * kv) + h * h
    a = model.heads
    qk = int(model.qk_nope_dim or 0) + int(model.qk_rope_dim or 0)
    q = h * model.q_lora_rank + model.q_lora_rank * a * qk if model.q_lora_rank else h * a * qk
    kv_proj = h * (int(model.kv_lora_rank or 0) + int(model.qk_rope_dim or 0))
    kv_up = int(model.kv_lora_rank or 0) * a * (int(model.qk_nope_dim or 0) + int(model.v_head_dim or 0))
    return q + kv_proj + kv_up + a * int(model.v_head_dim or 0) * h


def _mlp_matrices(model: ModelSpec) -> int:
    return 3 if model.glu else 2


def expert_params_per_layer(model: ModelSpec) -> float:
    """Routed-expert weights per layer, averaged over all layers (they shard over expert parallelism)."""
    if not model.is_moe:
        return 0.0
    one = _mlp_matrices(model) * model.hidden * model.expert_width
    return model.moe_layers * model.experts * one / model.layers


def _mlp_params_per_layer(model: ModelSpec) -> float:
    """MLP weights per layer outside the routed experts (dense MLPs, shared experts, routers), averaged."""
    h = model.hidden
    dense = _mlp_matrices(model) * h * model.ffn
    moe = model.moe_layers
    shared = model.shared_experts * _mlp_matrices(model) * h * model.expert_width + h * model.experts
    return ((model.layers - moe) * dense + moe * shared) / model.layers


def params_per_layer(model: ModelSpec) -> int:
    """Weights of one transformer block: attention, MLP, norms and (if any) biases (MoE: averaged over layers)."""
    h, f, kv = model.hidden, model.ffn, model.kv_width
    norms = 2 * (2 * h if model.norm == "layernorm" else h)
    if model.is_moe or model.is_mla:
        mlp = _mlp_params_per_layer(model) + expert_params_per_layer(model)
        return round(_attention_params(model) + mlp + norms)
    attn = h * (h + 2 * kv) + h * h
    mlp = (3 if model.glu else 2) * h * f
    biases = (h + 2 * kv) + h + (f * (2 if model.glu else 1)) + h if model.bias else 0
    return attn + mlp + norms + biases


def active_params(model: ModelSpec) -> float:
    """Parameters one token passes through (MoE: shared and top-k routed experts only); MFU counts these."""
    if not model.is_moe:
        return float(param_count(model))
    h = model.hidden
    one = _mlp_matrices(model) * h * model.expert_width
    routed = model.moe_layers * (model.experts - model.top_k) * one
    return float(param_count(model)) - routed


def expert_gemm_flops_per_token_layer(model: ModelSpec) -> float:
    """Forward FLOPs per token of the routed experts' MLPs (top-k of them), averaged over layers."""
    if not model.is_moe:
        return 0.0
    one = _mlp_matrices(model) * model.hidden * model.expert_width
    return 2.0 * model.moe_layers * model.top_k * one / model.layers


def embedding_params(model: ModelSpec) -> int:
    """Input embedding, learned positions (if any), untied output layer (if any) and the final norm."""
    h = model.hidden
    total = model.vocab * h
    if model.position == "learned":
        total += model.seq * h
    if not model.tied_embeddings:
        total += model.vocab * h
    total += 2 * h if model.norm == "layernorm" else h
    return total


def param_count(model: ModelSpec) -> int:
    """Total trainable parameters (for GPT-3 175B: 174.6e9, as Narayanan et al. 2021 Table 1)."""
    return model.layers * params_per_layer(model) + embedding_params(model)


def gemm_flops_per_token_layer(model: ModelSpec) -> float:
    """Forward matmul FLOPs per token in one block outside the attention core (QKV, output, MLP).

    MoE: shared experts, router and the top-k routed experts (active parameters), averaged over layers.
    """
    h, f, kv = model.hidden, model.ffn, model.kv_width
    if model.is_moe or model.is_mla:
        return 2.0 * (_attention_params(model) + _mlp_params_per_layer(model)) + expert_gemm_flops_per_token_layer(
            model
        )
    return 2.0 * (h * (h + 2 * kv) + h * h + (3 if model.glu else 2) * h * f)


def attention_flops_per_token_layer(model: ModelSpec, seq: int, causal: bool = False) -> float:
    """Forward FLOPs per token of the attention core (Q·Kᵀ and scores·V): ``4·s·h``, halved if causal.

    Latent attention (MLA) scores over ``qk_nope + qk_rope`` per head and mixes ``v_head_dim`` per head.
    """
    if model.is_mla:
        qk = int(model.qk_nope_dim or 0) + int(model.qk_rope_dim or 0)
        width = model.heads * (qk + int(model.v_head_dim or 0))
        return 2.0 * seq * width * (0.5 if causal else 1.0)
    return 4.0 * seq * model.hidden * (0.5 if causal else 1.0)


def logit_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the output projection onto the vocabulary."""
    return 2.0 * model.hidden * model.vocab


def model_flops_per_token(model: ModelSpec, seq: int | None = None, causal: bool = False) -> float:
    """Training model FLOPs per token (forward + backward = 3 x forward), no recomputation."""
    s = seq or model.seq
    layer = gemm_flops_per_token_layer(model) + attention_flops_per_token_layer(model, s, causal)
    return 3.0 * (model.layers * layer + logit_flops_per_token(model))


def model_flops_per_step(model: ModelSpec, global_batch: int, seq: int | None = None, causal: bool = False) -> float:
    """Model FLOPs of one optimizer step over ``global_batch`` sequences (the MFU numerator)."""
    s = seq or model.seq
    return global_batch * s * model_flops_per_token(model, s, causal)


def hardware_flops_per_step(
    model: ModelSpec,
    global_batch: int,
    seq: int | None = None,
    recompute: Recompute = "none",
    causal: bool = False,
) -> float:
    """FLOPs executed in one step including recomputation (the HFU numerator)."""
    s = seq or model.seq
    tokens = global_batch * s
    base = model_flops_per_step(model, global_batch, s, causal)
    attn = attention_flops_per_token_layer(model, s, causal)
    if recompute == "full":
        return base + tokens * model.layers * (gemm_flops_per_token_layer(model) + attn)
    if recompute == "selective":
        return base + tokens * model.layers * attn
    if recompute == "none":
        return base
    raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
