"""Step time, MFU and memory of a training layout: one vectorised model for ``perf step`` and ``plan``.

``evaluate`` takes layout arrays (any broadcastable shapes) and returns arrays, so the planner scores
millions of layouts in one call and ``estimate_step`` is the same code on arrays of one. The time of
one optimizer step on the slowest pipeline stage is

    m · T_mb  +  (p-1)/v · T_mb  +  PP send/recv  +  exposed DP communication  +  optimizer  +  overhead

where ``T_mb`` is that stage's forward + backward (+ recomputation) of one micro-batch, including the
exposed tensor-parallel collectives, and ``m = gbs / (dp · mbs)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.perf import collectives as coll
from gpufleet.perf.efficiency import Efficiency, default_efficiency
from gpufleet.perf.flops import (
    RECOMPUTE_MODES,
    attention_flops_per_token_layer,
    embedding_params,
    expert_gemm_flops_per_token_layer,
    expert_params_per_layer,
    gemm_flops_per_token_layer,
    hardware_flops_per_step,
    logit_flops_per_token,
    model_flops_per_step,
    param_count,
    params_per_layer,
)
from gpufleet.perf.gemm_io import (
    flash_length_efficiency,
    fp8_cast_elements_per_token_layer,
    gemm_output_bytes_per_token_layer,
)
from gpufleet.perf.memory import (
    activation_bytes_per_token_layer,
    activation_inventory,
    in_flight_stages,
    op_sac_recompute_share,
    state_bytes_per_param,
)
from gpufleet.perf.model_spec import ModelSpec
from gpufleet.perf.options import Layout, TrainOptions
from gpufleet.perf.stacks import resolve_stack
from gpufleet.perf.system import System

__all__ = ["BREAKDOWN_KEYS", "StepEstimate", "estimate_step", "evaluate", "layout_problems"]

#: Components of the step time, in the order reports show them.
BREAKDOWN_KEYS = (
    "compute",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_bubble",
    "pp_comm",
    "dp_comm_exposed",
    "optimizer",
    "overhead",
)

_ADAM_BYTES_PER_PARAM = 40.0  # read fp32 param, grad, m, v; write param, m, v; write bf16 copy


def _arr(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=float)


def _ep_all_to_all(
    model: ModelSpec,
    opt: TrainOptions,
    sw: Any,
    tokens: Any,
    ep: np.ndarray,
    stride: Any,
    system: System,
    intra_bw: float,
    nic_bw: float,
    rc: np.ndarray,
) -> np.ndarray:
    """Seconds per layer (averaged over all layers) of MoE dispatch + combine all-to-alls on one rank.

    Each of ``tokens`` tokens goes to ``top_k`` experts spread over ``ep`` ranks, ``ep_local`` of them in this
    node (EP peers sit ``stride`` = TP x CP ranks apart). Copies for ranks in the node cross NVLink. When EP
    spans nodes the exchange is hierarchical (DeepSeek-V3, DeepEP): a token crosses the NIC once per
    destination node (at most ``route_nodes`` with node-limited routing) and fans out over NVLink there.
    Forward: dispatch (fp8 with fp8 training) and combine (bf16); backward: the same again; full recompute
    repeats the forward. A capacity factor pads every expert's buffer to capacity: CF x the bytes.
    ``ep_overlap`` leaves ``ep_overlap_exposed`` of it on the critical path.
    """
    h = model.hidden
    k = float(model.top_k)
    per_node = float(system.gpus_per_node)
    ep_local = np.clip(per_node / np.asarray(stride, dtype=float), 1.0, ep)
    nodes = np.maximum(ep / ep_local, 1.0)
    # distinct nodes a token's top-k experts land on (uniform routing), capped by node-limited routing
    hit = nodes * (1.0 - (1.0 - 1.0 / nodes) ** k)
    if model.route_nodes:
        hit = np.minimum(hit, float(model.route_nodes))
    remote = np.where(nodes > 1, hit * (nodes - 1.0) / nodes, 0.0)
    local = k * (ep_local - 1.0) / ep + np.where(nodes > 1, k * (ep - ep_local) / ep, 0.0)
    b_dispatch = 1.0 if opt.precision == "fp8" else 2.0
    per_byte = local / intra_bw + remote / nic_bw
    one_pass = np.asarray(tokens, dtype=float) * h * (b_dispatch + 2.0) * per_byte * (model.capacity_factor or 1.0)
    passes = 2.0 + (np.asarray(rc) == 2)
    share = model.moe_layers / model.layers
    exposed = sw.ep_overlap_exposed if opt.ep_overlap else 1.0
    return np.where(ep > 1, passes * one_pass * share * exposed, 0.0)


def _fsdp_per_layer(
    ag: Any,
    rs: Any,
    param_bytes: np.ndarray,
    grad_bytes: np.ndarray,
    layers: np.ndarray,
    layer_t: np.ndarray,
    m: np.ndarray,
    reshard: bool,
    fwd_share: Any = 1.0 / 3.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(communication per micro-batch, exposed communication per step) of FSDP / ZeRO-3 on one stage.

    Per layer: all-gather its weights before forward (prefetched behind the previous layer's forward),
    again before backward when ``reshard`` (torchtitan's reshard_after_forward), and reduce-scatter its
    gradients behind the next layer's backward; the first gather and the last reduce-scatter of each
    micro-batch are never hidden. Forward is ``fwd_share`` of a layer's time (a third; a quarter with full
    recompute, whose backward runs the forward again), backward the rest. Without
    ``reshard`` (torchtitan with PP) the weights stay gathered and the gradients accumulate unsharded
    across the step's micro-batches: one gather and one reduce-scatter per step, not per micro-batch.
    """
    n = np.maximum(layers, 1.0)
    ag_l = ag(param_bytes / n)
    rs_l = rs(grad_bytes / n)
    fwd, bwd = layer_t * fwd_share, layer_t * (1.0 - fwd_share)
    bwd_comm = rs_l + (ag_l if reshard else 0.0)
    hidden_miss = np.maximum(ag_l - fwd, 0.0) + np.maximum(bwd_comm - bwd, 0.0)
    per_mb = n * (ag_l + bwd_comm)
    rounds = m if reshard else np.minimum(m, 1.0)
    exposed = rounds * (n * hidden_miss + ag_l + rs_l)
    return per_mb, exposed


def _weight_streaming(
    model: ModelSpec,
    opt: TrainOptions,
    tp: np.ndarray,
    ep: Any,
    t_gemm: np.ndarray,
    t_gemm_exp: Any,
    mem_rate: float,
    rc: np.ndarray,
) -> np.ndarray:
    """Time one layer's GEMM passes of a micro-batch lose to HBM when they have too few tokens to amortise
    reading their weights (the roofline, Williams et al. 2009; DeepGEMM's published Hopper table falls from
    1,304 TFLOPS at M = 4,096 to 932 at M = 256 for N = 4,096, K = 7,168).

    Forward and input-gradient passes read the weights (bf16, or fp8 copies); the weight-gradient pass
    accumulates into fp32 main gradients (read + write, Megatron's gradient-accumulation fusion) unless
    FSDP reduce-scatters bf16 gradients per micro-batch. Each pass takes the longer of its compute and its
    weight traffic; wide micro-batches (thousands of tokens per rank) are compute-bound and pay nothing.
    """
    w_bytes = 1.0 if opt.precision == "fp8" else 2.0
    g_bytes = 8.0 if opt.zero < 3 else 2.0
    experts = expert_params_per_layer(model) if model.is_moe else 0.0
    w_dense = (params_per_layer(model) - experts) / tp
    w_exp = experts / (tp * ep) if model.is_moe else 0.0
    t_dense = t_gemm - t_gemm_exp

    def short(t: Any, w: Any, b: float) -> np.ndarray:
        return np.maximum(w * b / mem_rate - t, 0.0)

    fwd = short(t_dense, w_dense, w_bytes) + short(t_gemm_exp, w_exp, w_bytes)
    wgrad = short(t_dense, w_dense, g_bytes) + short(t_gemm_exp, w_exp, g_bytes)
    return 2.0 * fwd + wgrad + np.where(rc == 2, fwd, 0.0)


def evaluate(
    model: ModelSpec,
    system: System,
    gbs: Any,
    tp: Any,
    pp: Any,
    dp: Any,
    cp: Any = 1,
    mbs: Any = 1,
    vp: Any = 1,
    recompute: Any = 0,
    seq: int | None = None,
    options: TrainOptions | None = None,
    efficiency: Efficiency | None = None,
    ep: Any = 1,
) -> dict[str, np.ndarray]:
    """Score layouts; every layout argument may be an array (recompute as codes 0 none, 1 selective, 2 full).

    ``ep`` is the expert-parallel degree of MoE models (carved out of DP x CP; 1 for dense models).

    Returns arrays: ``step_time_s``, the ``BREAKDOWN_KEYS`` components, ``microbatches``,
    ``memory_gb`` (and its parts), ``mfu``, ``hfu``, ``tokens_per_s``. Validity (divisibility, memory)
    is not checked here; see ``layout_problems``.
    """
    opt = options or TrainOptions()
    eff = efficiency or default_efficiency()
    ce = eff.for_gpu(system.gpu)
    link = eff.for_nic(system.nic)
    sw = eff.software
    rev2 = sw.revision >= 2  # model structure 2 (the simulator's frozen constants stay on 1)
    rev3 = sw.revision >= 3
    s = int(seq or model.seq)
    h, vocab = model.hidden, model.vocab
    tp, pp, dp, cp, mbs, vp = (_arr(x) for x in (tp, pp, dp, cp, mbs, vp))
    stack_constants, _, _ = resolve_stack(opt.stack, eff)
    moe = model.is_moe
    ep = _arr(ep) if moe else 1.0
    rc = np.asarray(recompute)
    gbs = _arr(gbs)
    n_gpus = tp * pp * dp * cp

    # --- compute per layer per micro-batch on one rank ---
    if opt.precision == "fp16" or system.gpu.dense_bf16_tflops is None:  # Volta/Turing train in fp16
        peak16 = system.gpu.dense_fp16_tflops * 1e12
    else:
        peak16 = system.gpu.dense_bf16_tflops * 1e12
    if opt.precision == "fp8":
        if system.gpu.dense_fp8_tflops is None:
            raise ConfigError(f"GPU {system.gpu.name!r} has no fp8 tensor cores; use --precision bf16")
        gemm_rate = system.gpu.dense_fp8_tflops * 1e12 * ce.fp8_gemm * (ce.gemm_efficiency(h / tp) / ce.gemm)
        if stack_constants is not None:  # the stack's fp8 recipe (scaling, casts) reaches this share of it
            gemm_rate = gemm_rate * stack_constants.fp8
    else:
        gemm_rate = peak16 * ce.gemm_efficiency(h / tp)
    mem_rate = system.gpu.memory_bw_gbps * 1e9 * ce.memory
    tok = mbs * s / cp  # tokens of one micro-batch on one rank
    t_gemm = gemm_flops_per_token_layer(model) * tok / tp / gemm_rate
    t_gemm_exp = 0.0
    if moe:  # routed experts run at the efficiency of their own (narrower) per-GPU width
        # with a capacity factor, experts run padded to capacity (static shapes): CF x the routed work
        expert_flops = expert_gemm_flops_per_token_layer(model)
        expert_rate = gemm_rate * ce.gemm_efficiency(model.expert_width / tp) / ce.gemm_efficiency(h / tp)
        padded = expert_flops * (model.capacity_factor or 1.0)
        t_gemm = (gemm_flops_per_token_layer(model) - expert_flops) * tok / tp / gemm_rate
        t_gemm_exp = padded * tok / tp / expert_rate
        t_gemm = t_gemm + t_gemm_exp
    window = min(1.0, opt.sliding_window / s) if opt.sliding_window else 1.0
    executed_attn = attention_flops_per_token_layer(model, s, causal=opt.flash_attention) * window
    attn_eff = ce.flash_attention if opt.flash_attention else ce.attention
    if opt.flash_attention and rev3:  # short key loops do not amortise a query tile's fixed work
        attn_eff = attn_eff * flash_length_efficiency(s, True, opt.sliding_window)
    t_attn = executed_attn * tok / tp / (peak16 * attn_eff)
    if not opt.flash_attention:  # scores written, softmaxed, dropped out and read back through HBM
        t_attn = t_attn + 10.0 * model.heads * s * window * tok / tp / mem_rate
    elem_bytes = ce.elementwise_bytes * (sw.fused_elementwise if opt.fused_ops else 1.0) * tok * h
    t_elem = elem_bytes / np.where(opt.sequence_parallel, tp, 1.0) / mem_rate
    t_fwd = t_gemm + t_attn + t_elem
    if moe and opt.ep_overlap:  # the SMs that drive the overlapped all-to-alls are lost to compute
        t_fwd = t_fwd / np.where(ep > 1, 1.0 - sw.overlap_comm_sm_share, 1.0)
    if stack_constants is not None:  # the stack reaches this share of the reference stack's compute rate
        t_fwd = t_fwd / stack_constants.compute
    if opt.selective_policy == "op" and not moe:  # torchtitan's per-op policy: every other matmul and the elementwise
        t_selective = op_sac_recompute_share(model) * t_gemm + t_elem
        if stack_constants is not None:
            t_selective = t_selective / stack_constants.compute
    else:
        t_selective = t_attn
    t_recompute = np.select([rc == 2, rc == 1], [t_fwd, t_selective], default=0.0)
    # kernel launches and host-side gaps of one layer's forward + backward (matter for small layers)
    t_layer_compute = 3.0 * t_fwd + t_recompute + sw.layer_overhead_us * 1e-6
    if opt.precision == "fp8":  # fp8 scaling launches an amax, a scale update and a cast around every GEMM operand
        t_layer_compute = t_layer_compute + sw.fp8_layer_overhead_us * 1e-6
    if rev3:  # GEMM outputs written through HBM: full-width outputs of narrow (row-parallel) GEMMs
        io_fwd, io_bwd = gemm_output_bytes_per_token_layer(model, tp)
        t_layer_compute = t_layer_compute + (io_fwd * (1.0 + (rc == 2)) + io_bwd) * tok / mem_rate
    if opt.precision == "fp8" and ce.fp8_cast_bytes > 0:  # dynamic scaling quantises every GEMM operand
        cast_fwd, cast_bwd = fp8_cast_elements_per_token_layer(model, tp)
        t_cast = ce.fp8_cast_bytes * (cast_fwd * (1.0 + (rc == 2)) + cast_bwd) * tok / mem_rate
        t_layer_compute = t_layer_compute + t_cast
    if rev2:  # GEMM roofline: no pass is faster than streaming its weights (or its fp32 weight gradients) once
        t_layer_compute = t_layer_compute + _weight_streaming(model, opt, tp, ep, t_gemm, t_gemm_exp, mem_rate, rc)

    # --- tensor-parallel collectives (all-reduce equivalents): 2 forward, 2 backward, 2 more with full recompute ---
    act_bytes = tok * h * 2.0
    intra_bw = system.intra_node_bytes_per_s * (eff.intra.nvlink if system.gpu.has_nvlink else eff.intra.pcie)
    intra_alpha = eff.intra.alpha_us * 1e-6
    nic_bw = system.nic_bytes_per_gpu * link.efficiency
    nic_alpha = link.alpha_us * 1e-6
    per_node = float(system.gpus_per_node)
    tp_ar = coll.hierarchical_all_reduce(
        act_bytes, tp, np.minimum(tp, per_node), intra_bw, nic_bw, intra_alpha, nic_alpha
    )
    block = 0.5 if opt.parallel_block else 1.0
    n_fwd = (2.0 + 2.0 * (rc == 2)) * block  # the forward's, and the forward again with full recompute
    n_bwd = 2.0 * block
    if opt.selective_policy == "op" and opt.sequence_parallel:  # torchtitan's per-op checkpointing saves matmul
        # outputs and reduce-scatters but not all-gathers (its _save_list), so the backward gathers the sequence-
        # parallel inputs of the QKV and MLP-up matmuls again: one all-reduce equivalent more per layer
        n_bwd = n_bwd + np.where(rc == 1, 1.0, 0.0)
    exposed = sw.tp_overlap_exposed if opt.tp_overlap else 1.0
    # revision 7: torchtitan's async TP fuses the forward's collectives into its matmuls only; the PyTorch post that
    # introduced it measures up to 29 % faster forwards but about 8 % end to end on Llama 3 8B and 70B
    exposed_bwd = exposed if opt.tp_overlap_backward else 1.0
    tp_layer = (n_fwd * exposed + n_bwd * exposed_bwd) * tp_ar

    # --- context-parallel K/V exchange: all-gather K and V over the CP group before attention (forward, and again
    # when recompute repeats it), reduce-scatter their gradients (backward), as Llama 3's all-gather CP does; with
    # TP inside a node, CP peers sit tp GPUs apart, on other nodes once tp * cp exceeds a node ---
    kv_bytes = 2.0 * cp * tok * model.kv_width * 2.0 / tp  # K and V of the whole sequence, this TP rank's heads
    cp_local = np.clip(per_node / tp, 1.0, cp)
    cp_gather = coll.hierarchical_all_gather(kv_bytes, cp, cp_local, intra_bw, nic_bw, intra_alpha, nic_alpha)
    cp_layer = np.where(cp > 1, (2.0 + (rc == 2)) * cp_gather, 0.0)

    # --- slowest stage: the slower of a full stage and the last one, which also runs the output layer and loss ---
    # every virtual chunk has room for ceil(L / (pp·vp)) layers; the slots L leaves empty go to the last stage
    # (keeping a layer in each of its chunks), which lightens it by as much (Llama 3 section 3.3.2 drops a layer
    # from its first and last stages; Megatron-Core's --decoder-last-pipeline-num-layers)
    layers_per_stage = np.ceil(model.layers / (pp * vp)) * vp
    empty_slots = np.where(pp > 1, layers_per_stage * pp - model.layers, 0.0)
    # revision 2: with two or more empty slots, the first stage (embedding, most micro-batches in flight) gives up
    # one layer and the last stage the rest (Llama 3 section 3.3.2 drops one layer from each)
    first_shed = np.where(rev2 & (empty_slots >= 2), 1.0, 0.0)
    t_logits = 3.0 * logit_flops_per_token(model) * tok / tp / gemm_rate + 3.0 * 8.0 * vocab * tok / tp / mem_rate
    if stack_constants is not None:
        t_logits = t_logits / stack_constants.compute
    if rev3 and model.mtp_depth:  # DeepSeek-V3's MTP modules run on the last stage after the main output layer
        # (its DualPipe and Megatron-Bridge's "...|mL" layout): per module one block and one more output head
        t_logits = t_logits * (1.0 + model.mtp_depth) + model.mtp_depth * t_layer_compute
    # expert-parallel dispatch and combine, averaged over layers like the MoE FLOPs
    ep_layer = _ep_all_to_all(model, opt, sw, tok / tp, ep, tp * cp, system, intra_bw, nic_bw, rc) if moe else 0.0
    layer_t = t_layer_compute + tp_layer + cp_layer + ep_layer
    # revision 2 lets the last chunk hold the output layer alone, as Llama 3's does
    shed = np.clip(empty_slots - first_shed, 0.0, layers_per_stage - vp + (1.0 if rev2 else 0.0))
    last_slowest = (layers_per_stage - shed) * layer_t + t_logits >= layers_per_stage * layer_t
    slow_layers = np.where(last_slowest, layers_per_stage - shed, layers_per_stage)
    compute_mb = slow_layers * t_layer_compute + np.where(last_slowest, t_logits, 0.0)
    tp_mb = slow_layers * tp_layer
    cp_mb = slow_layers * cp_layer
    t_mb = compute_mb + tp_mb + cp_mb
    if moe:
        ep_mb = slow_layers * ep_layer
        t_mb = t_mb + ep_mb

    m = gbs / (dp * mbs)
    bubble = np.where(pp > 1, (pp - 1.0) / vp * t_mb, 0.0)

    # --- pipeline send/recv: activations forward, gradients backward, per virtual stage. Each TP rank sends only
    # its 1/tp slice: with sequence parallelism the activation is already split; without it, Megatron's
    # scatter/gather optimisation (Narayanan 2021, section 4.1) splits it and the receiving node all-gathers
    # the slices over NVLink ---
    p2p_bytes = act_bytes / tp
    stage_stride = tp * cp * dp
    p2p_bw = np.where(stage_stride >= per_node, nic_bw, intra_bw)
    p2p_alpha = np.where(stage_stride >= per_node, nic_alpha, intra_alpha)
    regather = np.where(
        opt.sequence_parallel | (tp == 1),
        0.0,
        coll.hierarchical_all_gather(act_bytes, tp, np.minimum(tp, per_node), intra_bw, nic_bw, intra_alpha, nic_alpha),
    )
    t_p2p = coll.p2p(p2p_bytes, p2p_bw, p2p_alpha) + regather
    pp_comm = np.where(pp > 1, 2.0 * (m * vp + pp - 1.0) * t_p2p, 0.0)
    pp_hidden = opt.pp_overlap | (opt.pp_overlap_interleaved & (vp > 1))  # overlap_p2p_comm: interleaved only
    pp_comm = pp_comm * np.where(pp_hidden, sw.pp_overlap_exposed, 1.0)

    # --- data-parallel gradient reduction (over DP x CP ranks, which hold the same weights) ---
    # one pipeline stage holds every embedding (input, output if untied, positions); deeper pipelines
    # put the input embedding on the first stage and the output layer on the last
    stage_params = layers_per_stage * params_per_layer(model) + np.where(
        pp == 1, float(embedding_params(model)), float(model.vocab * h)
    )
    params_gpu = stage_params / tp
    # routed experts are sharded over EP (and TP) instead of replicated over DP: they leave the dense part
    stage_experts = layers_per_stage * expert_params_per_layer(model) if moe else 0.0
    expert_gpu = stage_experts / (tp * ep) if moe else 0.0
    if moe:
        params_gpu = params_gpu - stage_experts / tp
    n_dp = dp * cp
    dp_per_node = np.clip(per_node / (tp), 1.0, n_dp)
    span_gpus = tp * n_dp
    over = np.where(
        (system.rack_gpus is not None) & (span_gpus > (system.rack_gpus or np.inf)), system.oversubscription, 1.0
    )
    dp_nic_bw = nic_bw / over
    grad_bytes = params_gpu * opt.grad_reduce_bytes
    param_bytes = params_gpu * 2.0

    def rs(size: np.ndarray) -> np.ndarray:
        return coll.hierarchical_reduce_scatter(size, n_dp, dp_per_node, intra_bw, dp_nic_bw, intra_alpha, nic_alpha)

    def ag(size: np.ndarray) -> np.ndarray:
        return coll.hierarchical_all_gather(size, n_dp, dp_per_node, intra_bw, dp_nic_bw, intra_alpha, nic_alpha)

    if opt.zero == 3:  # FSDP: per layer, gather weights for forward (and backward), reduce-scatter grads
        per_mb, dp_exposed = _fsdp_per_layer(
            ag,
            rs,
            param_bytes,
            grad_bytes,
            layers_per_stage,
            layer_t,
            m,
            opt.reshard_after_forward,
            np.where(rc == 2, 0.25, 1.0 / 3.0),  # full recompute runs the forward again inside the backward
        )
    else:
        if opt.zero == 0:
            t_dp = coll.hierarchical_all_reduce(
                grad_bytes, n_dp, dp_per_node, intra_bw, dp_nic_bw, intra_alpha, nic_alpha
            )
        else:
            t_dp = rs(grad_bytes) + ag(param_bytes)
        window = t_mb * sw.dp_overlap_window if opt.dp_overlap else 0.0
        if rev3:  # a stage idles through its pipeline bubble (first stage: cool-down, last: warm-up), where the
            # overlapped gradient reduce-scatter and next step's parameter all-gather keep running
            window = window + np.where(opt.dp_overlap, bubble, 0.0)
        dp_exposed = np.maximum(t_dp - window, 0.0)
    dp_exposed = np.where(n_dp > 1, dp_exposed, 0.0)
    if moe:  # expert gradients reduce over the n_dp / ep ranks that hold the same experts
        n_edp = np.maximum(n_dp / ep, 1.0)
        edp_node = np.clip(dp_per_node / ep, 1.0, n_edp)
        e_grad = coll.hierarchical_reduce_scatter(
            expert_gpu * opt.grad_reduce_bytes, n_edp, edp_node, intra_bw, dp_nic_bw, intra_alpha, nic_alpha
        ) + coll.hierarchical_all_gather(expert_gpu * 2.0, n_edp, edp_node, intra_bw, dp_nic_bw, intra_alpha, nic_alpha)
        if opt.zero == 3:
            e_grad = m * (
                e_grad
                + coll.hierarchical_all_gather(
                    expert_gpu * 2.0, n_edp, edp_node, intra_bw, dp_nic_bw, intra_alpha, nic_alpha
                )
                * opt.reshard_after_forward
            )
        e_window = t_mb * sw.dp_overlap_window if (opt.dp_overlap or opt.zero == 3) else 0.0
        dp_exposed = dp_exposed + np.where(n_edp > 1, np.maximum(e_grad - e_window, 0.0), 0.0)

    # --- optimizer: Adam over this rank's shard, memory-bound ---
    opt_params = params_gpu / np.where(opt.zero >= 1, n_dp, 1.0)
    if moe:
        opt_params = opt_params + expert_gpu / np.where(opt.zero >= 1, np.maximum(n_dp / ep, 1.0), 1.0)
    optimizer = opt_params * _ADAM_BYTES_PER_PARAM / mem_rate

    compute = m * compute_mb
    tp_comm = m * tp_mb
    cp_comm = m * cp_mb
    ep_comm = m * ep_mb if moe else 0.0 * compute
    overhead = np.full_like(compute, sw.step_overhead_s)
    step = compute + tp_comm + cp_comm + bubble + pp_comm + dp_exposed + optimizer + overhead
    if moe:
        step = step + ep_comm

    # --- memory per GPU on the first stage (most micro-batches in flight) ---
    ob = opt.optimizer_bytes if rev2 else 12.0
    # revision 9: the gradient buffer's dtype (bf16 in NeMo's performance recipes) and PyTorch FSDP's fp32 shards
    sb = {"grad_bytes": float(opt.grad_reduce_bytes), "sharded_fp32_params": opt.sharded_fp32_params} if rev3 else {}
    states = stage_params / tp * state_bytes_per_param(opt.zero, n_dp, ob, **sb)
    if moe:
        states = params_gpu * state_bytes_per_param(opt.zero, n_dp, ob, **sb) + expert_gpu * state_bytes_per_param(
            opt.zero, np.maximum(n_dp / ep, 1.0), ob, **sb
        )
    dualpipe = rev2 and opt.schedule == "dualpipe"
    if dualpipe:  # DualPipe keeps two copies of the parameters (DeepSeek-V3 Table 2): each rank holds two stages
        states = 2.0 * states
    if opt.zero == 3:  # FSDP holds the gathered weights of about two layers (current and prefetched)
        states = states + 2.0 * 2.0 * (stage_params - stage_experts) / tp / layers_per_stage
    act_tok = activation_bytes_per_token_layer(model, s, tp, rc, opt.sequence_parallel, opt.flash_attention)
    m = gbs / (dp * mbs)
    # 1F1B: the first stage holds p micro-batches; interleaved (v > 1): p + (p-1)/v (Korthikanti 2022)
    in_flight = np.where(pp > 1, np.minimum(m, pp) + np.where(vp > 1, (pp - 1.0) / vp, 0.0), 1.0)
    activations = act_tok * tok * layers_per_stage * in_flight
    full_layer = activation_bytes_per_token_layer(
        model, s, tp, np.zeros_like(rc), opt.sequence_parallel, opt.flash_attention
    )
    activations = activations + np.where(rc == 2, full_layer * tok, 0.0)  # the layer being recomputed
    logits_mem = 10.0 * vocab * tok / tp  # bf16 logits + fp32 softmax of the last stage
    if rev2:  # per pipeline rank: the first, the second (full stage, two fewer chunk-forwards) and the last
        inv = activation_inventory(
            model,
            s,
            tp,
            rc,
            opt.sequence_parallel,
            opt.flash_attention,
            fp8_cache=opt.precision == "fp8" and opt.fp8_cache,
            lean=opt.lean_activations,
            selective_policy=opt.selective_policy,
            modules=opt.recompute_modules,
        )
        per_layer = inv * tok
        first = per_layer * (layers_per_stage - first_shed) * in_flight_stages(pp, vp, m, 0, dualpipe)
        second = np.where(pp > 2, per_layer * layers_per_stage * in_flight_stages(pp, vp, m, 1, dualpipe), 0.0)
        last = per_layer * (layers_per_stage - shed) * in_flight_stages(pp, vp, m, -1, dualpipe)
        activations = np.where(pp > 1, np.maximum(np.maximum(first, second), last + logits_mem), first + logits_mem)
        whole = activation_inventory(
            model,
            s,
            tp,
            np.zeros_like(rc),
            opt.sequence_parallel,
            opt.flash_attention,
            fp8_cache=opt.precision == "fp8" and opt.fp8_cache,
            lean=opt.lean_activations,
        )
        activations = activations + np.where(rc == 2, whole * tok, 0.0)  # the layer being recomputed
        logits_mem = 0.0
    memory = states + activations + logits_mem + sw.memory_reserve_gb * 1e9

    # revision 2 counts memory in GiB, the unit of a GPU's rated memory (an "80 GB" H100 or A100 has 80 GiB)
    unit = 2.0**30 if rev2 else 1e9
    flops_model = model_flops_per_step(model, 1, s, causal=opt.causal_flops) * gbs
    peak_total = n_gpus * peak16
    hw = {
        code: hardware_flops_per_step(model, 1, s, mode, causal=opt.causal_flops)
        for code, mode in enumerate(RECOMPUTE_MODES)
    }
    flops_hw = np.select([rc == 0, rc == 1], [hw[0], hw[1]], default=hw[2]) * gbs
    return {
        "step_time_s": step,
        "compute": compute,
        "tp_comm": tp_comm,
        "cp_comm": cp_comm + 0.0 * step,
        "ep_comm": ep_comm + 0.0 * step,
        "pp_bubble": m * 0 + bubble,
        "pp_comm": pp_comm,
        "dp_comm_exposed": dp_exposed,
        "optimizer": optimizer,
        "overhead": overhead,
        "microbatches": m,
        "memory_gb": memory / unit,
        "memory_states_gb": states / unit,
        "memory_activations_gb": activations / unit,
        "mfu": flops_model / (step * peak_total),
        "hfu": flops_hw / (step * peak_total),
        "tokens_per_s": gbs * s / step,
        # per-unit pieces for models that assemble uneven pipelines (perf.hetero)
        "layer_s": t_layer_compute + tp_layer + cp_layer,
        "logits_s": t_logits,
        "p2p_s": t_p2p,
        "dp_s": np.where(n_dp > 1, t_dp if opt.zero != 3 else m * per_mb, 0.0) + 0.0 * step,
        "stage_params": stage_params + 0.0 * step,
    }


def layout_problems(model: ModelSpec, gpus: int, gbs: int, layout: Layout, seq: int | None = None) -> list[str]:
    """Why ``layout`` cannot run ``model`` on ``gpus`` GPUs at global batch ``gbs`` (empty when it can)."""
    s = seq or model.seq
    problems = []
    if layout.gpus != gpus:
        problems.append(f"TP x PP x DP x CP = {layout.gpus}, not the {gpus} GPUs asked for")
    if model.heads % layout.tp:
        problems.append(f"TP={layout.tp} does not divide the {model.heads} attention heads")
    if layout.pp * layout.vp > model.layers + 2:  # at most an embedding-only and an output-only chunk (Llama 3)
        problems.append(f"PP x VP = {layout.pp * layout.vp} exceeds the {model.layers} layers (+2)")
    if layout.vp > 1 and layout.pp == 1:
        problems.append("virtual stages (VP > 1) need pipeline parallelism (PP > 1)")
    if gbs % (layout.dp * layout.mbs):
        problems.append(f"global batch {gbs} is not a multiple of DP x mbs = {layout.dp * layout.mbs}")
    if s % layout.cp:
        problems.append(f"CP={layout.cp} does not divide the sequence length {s}")
    if layout.ep > 1 and not model.is_moe:
        problems.append(f"EP={layout.ep} needs a mixture-of-experts model; {model.name} is dense (use --ep 1)")
    elif layout.ep > 1:
        if (layout.dp * layout.cp) % layout.ep:
            problems.append(f"EP={layout.ep} does not divide DP x CP = {layout.dp * layout.cp}")
        if model.experts % layout.ep:
            problems.append(f"EP={layout.ep} does not divide the {model.experts} experts")
    return problems


@dataclass(frozen=True)
class StepEstimate:
    """The predicted cost of one optimizer step of one layout."""

    model: ModelSpec
    layout: Layout
    system: System
    options: TrainOptions
    gbs: int
    seq: int
    values: dict[str, float]

    @property
    def step_time_s(self) -> float:
        """Seconds per optimizer step."""
        return self.values["step_time_s"]

    @property
    def fits(self) -> bool:
        """Whether the estimated memory fits in the GPU."""
        return self.values["memory_gb"] <= self.system.gpu.memory_gb

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: the fields ``perf step --json`` prints."""
        v = self.values
        gpus = self.layout.gpus
        return {
            "model": self.model.name,
            "params_b": param_count(self.model) / 1e9,
            "gpu": self.system.gpu.name,
            "gpus": gpus,
            "layout": self.layout.model_dump(),
            "gbs": self.gbs,
            "seq": self.seq,
            "microbatches": v["microbatches"],
            "step_time_s": v["step_time_s"],
            "mfu": v["mfu"],
            "hfu": v["hfu"],
            "tokens_per_s": v["tokens_per_s"],
            "tokens_per_s_per_gpu": v["tokens_per_s"] / gpus,
            "model_tflops_per_gpu": v["mfu"] * self.system.gpu.mixed_precision_tflops,
            "memory_gb_per_gpu": v["memory_gb"],
            "memory_breakdown_gb": {
                "weights_grads_optimizer": v["memory_states_gb"],
                "activations": v["memory_activations_gb"],
            },
            "fits_in_memory": self.fits,
            "breakdown": {k: v[k] for k in BREAKDOWN_KEYS},
            "flop_convention": (
                "model FLOPs, attention counted "
                + ("causal (half square)" if self.options.causal_flops else "over the full s x s square")
                + f"; peak = dense {'fp16' if self.options.precision == 'fp16' else 'bf16'}"
            ),
            "options": self.options.model_dump(),
            "system": self.system.describe(),
        }


def estimate_step(
    model: ModelSpec,
    system: System,
    layout: Layout,
    gbs: int,
    seq: int | None = None,
    options: TrainOptions | None = None,
    efficiency: Efficiency | None = None,
    check: bool = True,
) -> StepEstimate:
    """Predict one step of ``layout``; ConfigError lists why the layout is impossible (when ``check``)."""
    s = int(seq or model.seq)
    if check:
        problems = layout_problems(model, layout.gpus, gbs, layout, s)
        if problems:
            raise ConfigError(f"layout {layout.describe()} is invalid: " + "; ".join(problems))
    opts = options or TrainOptions()
    out = evaluate(
        model,
        system,
        gbs,
        layout.tp,
        layout.pp,
        layout.dp,
        layout.cp,
        layout.mbs,
        layout.vp,
        RECOMPUTE_MODES.index(layout.recompute),
        s,
        opts,
        efficiency,
        ep=layout.ep,
    )
    values = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in out.items()}
    return StepEstimate(model, layout, system, opts, int(gbs), s, values)
