"""Memory per GPU of a training layout, vectorised over layout arrays.

Weights, gradients and Adam states follow Megatron's distributed-optimizer table (bytes per
parameter: 18 without sharding; 6 + 12/d with the distributed optimizer / ZeRO-1; 2 + 16/d with
ZeRO-2; 18/d with ZeRO-3 / FSDP). Activations follow Korthikanti et al. 2022: for GPT
``s·b·h·(34 + 5·a·s/h)`` bytes per layer without parallelism, the ``34`` part split by TP under
sequence parallelism, the ``5·a·s/h`` score part gone with selective recompute or flash attention,
``2·s·b·h`` with full recompute; the first pipeline stage holds ``p`` micro-batches in flight, times
``1 + (p-1)/(p·v)`` when interleaved.
"""

from __future__ import annotations

import numpy as np

from gpufleet.perf.model_spec import ModelSpec

__all__ = ["activation_bytes_per_token_layer", "state_bytes_per_param"]


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


def state_bytes_per_param(zero: int, dp: np.ndarray) -> np.ndarray:
    """Bytes per parameter of weights + gradients + Adam states with bf16 weights and fp32 master copy."""
    d = np.asarray(dp, dtype=float)
    if zero == 0:
        return np.full_like(d, 18.0)
    if zero == 1:
        return 6.0 + 12.0 / d
    if zero == 2:
        return 2.0 + 16.0 / d
    return 18.0 / d
