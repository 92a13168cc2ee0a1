"""Shape costs of revision 3 from published kernel benchmarks: GEMM output writes and short attention loops.

HBM traffic of the GEMM outputs of one transformer layer is the cost of narrow (tensor-parallel) GEMMs.

A GEMM of M tokens writes its M x N output once, however short its inner dimension K is. A row-parallel
GEMM under tensor parallelism (attention output and second MLP projection; the input-gradient GEMMs of the
column-parallel ones) keeps its full output width while its FLOPs shrink with TP, so the write becomes a
visible share of its time. DeepGEMM's published Hopper table (deepseek-ai/DeepGEMM README, April 2025,
M = 4,096) shows that time adding to the compute rather than hiding behind it: N = 32,768 and K = 512 runs
at 775 TFLOPS, the compute at the large-shape rate plus the bf16 output written at HBM bandwidth predicts
781; N = 7,168 and K = 2,048 runs at 1,168 against 1,162 predicted. No constant is fitted here: the bytes
follow from the layer's shapes and the rate is the GPU's memory bandwidth.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpufleet.perf.model_spec import ModelSpec

__all__ = [
    "ATTENTION_HALF_LENGTH",
    "flash_length_efficiency",
    "fp8_cast_elements_per_token_layer",
    "gemm_output_bytes_per_token_layer",
]

_OUT_BYTES = 2.0  # GEMM outputs are written in bf16 (fp8 GEMMs too: Transformer Engine, DeepGEMM)


def gemm_output_bytes_per_token_layer(model: ModelSpec, tp: Any) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) bytes per token that one layer's GEMMs write, on one TP rank (MoE: averaged over
    layers, per routed and shared expert a token visits). Forward: QKV (sharded), attention output (full
    width), MLP up (sharded), MLP down (full width). Backward input gradients: the transposes. Weight
    gradients are written per micro-batch into the main gradients (counted with the weight traffic)."""
    tp = np.asarray(tp, dtype=float)
    h, kv = float(model.hidden), float(model.kv_width)
    g = 2.0 if model.glu else 1.0
    attn_fwd = (h + 2.0 * kv) / tp + h
    attn_bwd = h + h / tp

    def mlp(width: float, visits: float) -> tuple[np.ndarray, np.ndarray]:
        return visits * (g * width / tp + h), visits * (h + width / tp)

    dense_f, dense_b = mlp(float(model.ffn), 1.0)
    if model.is_moe:
        share = model.moe_layers / model.layers
        moe_f, moe_b = mlp(float(model.expert_width), float(model.top_k + model.shared_experts))
        dense_f = (1.0 - share) * dense_f + share * moe_f
        dense_b = (1.0 - share) * dense_b + share * moe_b
    return _OUT_BYTES * (attn_fwd + dense_f), _OUT_BYTES * (attn_bwd + dense_b)


def fp8_cast_elements_per_token_layer(model: ModelSpec, tp: Any) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) activation elements per token that fp8 training quantises in one layer on one TP rank.

    With dynamic (per-tensor or per-row) scaling every fp8 GEMM operand is scaled and cast from bf16 first
    (torchao.float8 and Transformer Engine: ``to_fp8(input) @ to_fp8(weight)`` forward, ``to_fp8(grad_output)``
    for both backward GEMMs, and a transposed fp8 copy of the input for the weight gradient). Forward: the inputs
    of QKV, attention output, MLP up and MLP down, i.e. the shapes of the input gradients; backward: the output
    gradients, i.e. the shapes of the forward outputs. These casts are memory-bound and do not shrink with the
    GEMM's inner dimension, so narrow (tensor-parallel) fp8 GEMMs lose most of their speed-up to them, as
    torchao's float8 microbenchmarks show for small M, K, N.
    """
    fwd_out, bwd_out = gemm_output_bytes_per_token_layer(model, tp)
    return bwd_out / _OUT_BYTES, fwd_out / _OUT_BYTES


#: Keys per query at which fused (flash) attention runs at half its long-sequence rate. From the published
#: H100 sweep in pytorch/benchmark's FlashAttention-3 commit (ff65cb6, d_head 128, B x S = 16K tokens): FA2
#: reaches 329, 390, 434, 458, 471, 477 TFLOPS at 512 ... 16K keys and FA3 430 ... 621, i.e. 0.69, 0.82, 0.91,
#: 0.96 of the 16K rate at 512, 1K, 2K and 4K keys, which L / (L + 230) reproduces within 2 points: each query
#: tile pays a fixed prologue and epilogue (load Q, rescale and write O) that only long key loops amortise.
ATTENTION_HALF_LENGTH = 230.0


def flash_length_efficiency(seq: float, causal: bool, window: float | None = None) -> float:
    """Share of the long-sequence rate fused attention reaches when each query visits ``seq`` keys (half of
    them on average when ``causal``; at most ``window`` with sliding-window attention)."""
    keys = seq / 2.0 if causal else float(seq)
    if window:
        keys = min(keys, float(window))
    return keys / (keys + ATTENTION_HALF_LENGTH)
