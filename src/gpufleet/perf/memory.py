"""Memory per GPU of a training layout, vectorised over layout arrays.

Weights, gradients and Adam states follow Megatron's distributed-optimizer table (bytes per
parameter: 18 without sharding; 6 + 12/d with the distributed optimizer / ZeRO-1; 2 + 16/d with
ZeRO-2; 18/d with ZeRO-3 / FSDP). Activations follow Korthikanti et al. 2022: for GPT
``s·b·h·(34 + 5·a·s/h)`` bytes per layer without parallelism, the ``34`` part split by TP under
sequence parallelism, the ``5·a·s/h`` score part gone with selective recompute or flash attention,
``2·s·b·h`` with full recompute; the first pipeline stage holds ``p`` micro-batches in flight, times
``1 + (p-1)/(p·v)`` when interleaved. ``activation_inventory`` and ``in_flight_stages`` are revision 2 of
that model (per op and per pipeline rank; see their docstrings); revision 1 stays for the simulator.
"""

from __future__ import annotations

import numpy as np

from gpufleet.perf.model_spec import ModelSpec

__all__ = [
    "activation_bytes_per_token_layer",
    "activation_inventory",
    "in_flight_stages",
    "op_sac_recompute_share",
    "state_bytes_per_param",
]


def activation_bytes_per_token_layer(
    model: ModelSpec, seq: int, tp: np.ndarray, recompute_code: np.ndarray, sequence_parallel: bool, flash: bool
) -> np.ndarray:
    """Bytes one layer keeps for the backward pass, per token of a micro-batch, on one TP rank."""
    h, f = model.hidden, model.ffn
    kv = model.kv_width / h
    tp = np.asarray(tp, dtype=float)
    # Korthikanti's per-layer inventory in units of (tokens x h) bytes, generalised to GQA and GLU.
    replicated = 4.0 + 2.0 + 2.0 + 2.0  # two norm inputs, two dropout masks, QKV input, MLP input
    attn_sharded = 2.0 + 4.0 * kv + 2.0  # Q, K and V, input of the output projection
    mlp_sharded = (6.0 if model.glu else 4.0) * f / h  # fc1 output(s) and activation output
    sharded = attn_sharded + mlp_sharded
    body = np.where(sequence_parallel, (replicated + sharded) / tp, replicated + sharded / tp) * h
    scores = 0.0 if flash else 5.0 * model.heads * seq / tp  # softmax out, dropout mask and out
    none = body + scores
    selective = body
    full = 2.0 * h / np.where(sequence_parallel, tp, 1.0)
    code = np.asarray(recompute_code)
    return np.select([code == 0, code == 1], [none, selective], default=full)


def state_bytes_per_param(
    zero: int,
    dp: np.ndarray,
    optimizer_bytes: float = 12.0,
    grad_bytes: float = 4.0,
    sharded_fp32_params: bool = False,
) -> np.ndarray:
    """Bytes per parameter of weights + gradients + Adam states with bf16 weights.

    ``optimizer_bytes`` is the master copy and the two moments (12 in fp32; 8 with bf16 moments, DeepSeek-V3).
    ``grad_bytes`` is the gradient buffer's element (4: fp32, Megatron's default; 2: bf16). With bf16 gradients the
    optimizer also holds an fp32 copy of its gradient shard: Megatron's distributed-optimizer table gives "fp16 param,
    fp16 grads" 20 bytes unsharded and 4 + 16/d sharded, against 18 and 6 + 12/d with fp32 gradients (revision 9).
    ``sharded_fp32_params`` (ZeRO-3 only): the fp32 shard is the master copy and no bf16 shard persists (PyTorch FSDP).
    """
    d = np.asarray(dp, dtype=float)
    g = float(grad_bytes)
    ob = float(optimizer_bytes) + (4.0 if g < 4.0 else 0.0)  # the fp32 copy of a bf16 gradient shard
    if zero == 0:
        return np.full_like(d, 2.0 + g + ob)
    if zero == 1:
        return 2.0 + g + ob / d
    if zero == 2:
        return 2.0 + (g + ob) / d
    if sharded_fp32_params:  # fp32 parameter shard (= master), fp32 gradient shard, moments
        return (4.0 + float(optimizer_bytes)) / d
    return (2.0 + g + ob) / d


def _mlp_bytes(width: float, glu: bool, lin: float, lean: bool) -> float:
    """Bytes per token one MLP of ``width`` keeps, beyond its input: fc1 output(s) and the fc2 input."""
    fc1_out = (2.0 if glu else 1.0) * width
    if lean:  # DeepSeek-V3: the SwiGLU input is cached in fp8 and its output recomputed
        return fc1_out * 1.0
    return fc1_out * 2.0 + width * lin


def op_sac_recompute_share(model: ModelSpec) -> float:
    """Share of a dense layer's matmul FLOPs that torchtitan's op-level selective checkpointing recomputes.

    Its policy saves every other matmul output (1st, 3rd, ...) and the attention output of each block and
    recomputes the rest (torchtitan ``_apply_ac_to_transformer_block``, ``selective_ac_option = "op"``).
    """
    h, f, kv = float(model.hidden), float(model.ffn), float(model.kv_width)
    mms = [h * h, h * kv, h * kv, h * h, h * f] + ([h * f, f * h] if model.glu else [f * h])
    return sum(mms[1::2]) / sum(mms)


def _op_sac_bytes(model: ModelSpec) -> float:
    """Bytes per token of one layer under op-level selective checkpointing: its input, the saved matmul
    outputs (every other one) and the attention output."""
    h, f, kv = float(model.hidden), float(model.ffn), float(model.kv_width)
    outs = [h, kv, kv, h, f] + ([f, h] if model.glu else [h])
    return 2.0 * h + 2.0 * sum(outs[0::2]) + 2.0 * h


def activation_inventory(
    model: ModelSpec,
    seq: int,
    tp: np.ndarray,
    recompute_code: np.ndarray,
    sequence_parallel: bool,
    flash: bool,
    *,
    fp8_cache: bool = False,
    lean: bool = False,
    selective_policy: str = "attention",
    modules: tuple[str, ...] = (),
) -> np.ndarray:
    """Bytes one layer keeps for the backward pass, per token of a micro-batch, on one TP rank (revision 2).

    Korthikanti et al. 2022's per-tensor inventory, op by op, with what current stacks do differently:
    no dropout masks for models trained without dropout; routed experts keep top-k copies of their
    activations (dispatched input, fc1 output, fc2 input, output for the weighted combine) and shared
    experts their own; latent attention keeps its compressed latents and per-head Q, K, V; with fp8
    (``fp8_cache``, Transformer Engine) linear-layer inputs are kept in fp8; ``lean`` is DeepSeek-V3's recipe
    (norms and latent up-projections recomputed, SwiGLU output recomputed from its fp8 input, attention
    output in E5M6); selective recompute is either the attention core or torchtitan's per-op policy, and ``modules``
    (Megatron-Core's ``--recompute-modules``) adds, under selective recompute, latent attention's up-projections
    (``mla_up_proj``: per-head Q, K and V not kept) and dense layers' MLPs (``mlp``: only their input kept).
    """
    h = float(model.hidden)
    tp = np.asarray(tp, dtype=float)
    lin = 1.0 if fp8_cache else 2.0
    sp = np.where(sequence_parallel, tp, 1.0)
    masks = 2.0 * h if model.dropout else 0.0  # attention and MLP dropout masks, one byte each
    # replicated across TP (split by it under sequence parallelism): norm inputs and outputs (= linear inputs)
    norm_out = 0.0 if lean else 2.0 * lin * h
    replicated = 2.0 * 2.0 * h + norm_out + masks
    if model.is_mla:
        qk = float((model.qk_nope_dim or 0) + (model.qk_rope_dim or 0))
        o_width = model.heads * float(model.v_head_dim or 0)
        latents = float((model.q_lora_rank or 0) + (model.kv_lora_rank or 0) + (model.qk_rope_dim or 0))
        qkv = 0.0 if lean else 2.0 * model.heads * 2.0 * qk + 2.0 * o_width
        replicated = replicated + latents * (1.0 if lean else lin + 2.0)  # latents: up-projection input (+ norm)
    else:
        o_width = h
        qkv = 2.0 * (h + 2.0 * model.kv_width)
    # E5M6 in DeepSeek-V3's recipe; with Transformer Engine fp8 the out-projection keeps its own fp8 copy
    attn_out = 1.5 * o_width if lean else (2.0 + (lin if fp8_cache else 0.0)) * o_width
    dense_mlp = _mlp_bytes(float(model.ffn), model.glu, lin, lean)
    if model.is_moe:
        ew = float(model.expert_width)
        # dispatched input and MLP; no expert output: the router weights scale the SwiGLU output inside the expert
        # (Megatron-Core's weighted_bias_swiglu_impl), so their gradient needs only what the SwiGLU keeps, and the
        # combine is a scatter-add that keeps nothing
        per_copy = lin * h + _mlp_bytes(ew, model.glu, lin, lean)
        routed = model.top_k * (model.capacity_factor or 1.0) * per_copy
        shared = model.shared_experts * _mlp_bytes(ew, model.glu, lin, lean)
        frac = model.moe_layers / model.layers
        mlp = frac * (routed + shared) + (1.0 - frac) * dense_mlp
    else:
        mlp = dense_mlp
    sharded = qkv + attn_out + mlp
    body = replicated / sp + sharded / tp
    scores = 0.0 if flash else 5.0 * model.heads * seq / tp
    code = np.asarray(recompute_code)
    op_policy = selective_policy == "op" and not model.is_moe
    selective = _op_sac_bytes(model) / tp + 0.0 * body if op_policy else body
    if modules and not op_policy:  # Megatron-Core's recompute modules: what they would have kept is recomputed
        dropped = qkv if ("mla_up_proj" in modules and model.is_mla) else 0.0
        if "mlp" in modules:  # dense layers only (MoE layers have their own module, "moe")
            dense_share = 1.0 - (model.moe_layers / model.layers if model.is_moe else 0.0)
            dropped = dropped + dense_share * dense_mlp
        selective = body - dropped / tp
    full = 2.0 * h / sp
    return np.select([code == 0, code == 1], [body + scores, selective], default=full)


def in_flight_stages(pp: np.ndarray, vp: np.ndarray, m: np.ndarray, rank: int, dualpipe: bool = False) -> np.ndarray:
    """Micro-batches of activations (in units of the rank's whole stage) that pipeline ``rank`` holds at peak.

    Interleaved 1F1B (Megatron): ``2·(p-1-rank) + (v-1)·p + 1`` chunk-forwards run before the rank's first
    backward, each holding ``1/v`` of its stage; plain 1F1B: ``p - rank``; never more than the step's
    micro-batches. DualPipe holds ``p + 1`` (DeepSeek-V3 Table 2).
    """
    pp, vp, m = (np.asarray(x, dtype=float) for x in (pp, vp, m))
    r = np.minimum(float(rank), pp - 1.0) if rank >= 0 else pp - 1.0
    interleaved = np.minimum(m * vp, 2.0 * (pp - 1.0 - r) + (vp - 1.0) * pp + 1.0) / vp
    plain = np.minimum(m, pp - r)
    out = np.where(vp > 1, interleaved, plain)
    if dualpipe:
        out = np.minimum(m, pp + 1.0)
    return np.where(pp > 1, out, 1.0)
