"""Training-software options the performance model honours, and the parallel layout of one run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.perf.flops import Recompute

__all__ = ["Layout", "TrainOptions"]


class TrainOptions(BaseModel):
    """What the training software does: precision, kernels, sharding and overlap.

    Defaults describe a current Megatron-Core run without communication overlap. ``megascale()``
    switches on MegaScale's optimisations (arXiv 2402.15627 §3): overlap of TP, PP and DP
    communication with compute, the parallel transformer block, sliding-window attention and fused
    operators.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    flash_attention: bool = True
    sequence_parallel: bool = True
    zero: Literal[0, 1, 2, 3] = Field(
        default=1, description="0 plain DP; 1 distributed optimizer / ZeRO-1; 2 + sharded grads; 3 FSDP"
    )
    grad_reduce_bytes: Literal[2, 4] = Field(
        default=4,
        description="bytes per gradient element of the gradient buffer and its reduction: 4 fp32 (Megatron), 2 bf16 "
        "(NeMo's grad_reduce_in_fp32: false, Apex's grad_sync_dtype: bf16); revision 9 charges it in memory too",
    )
    tp_overlap: bool = False
    tp_overlap_backward: bool = Field(
        default=True,
        description="TP overlap hides the backward's collectives too (Transformer Engine's userbuffers); torchtitan's "
        "async TP (micro-pipelined all-gather / reduce-scatter matmuls) hides the forward's only",
    )
    pp_overlap: bool = False
    pp_overlap_interleaved: bool = Field(
        default=False,
        description="pipeline send/recv overlapped with compute under the interleaved schedule only (virtual stages "
        "> 1): Megatron-Core's overlap_p2p_comm, which NeMo's recipes set (revision 8)",
    )
    dp_overlap: bool = False
    parallel_block: bool = False
    fused_ops: bool = False
    sliding_window: int | None = Field(default=None, gt=0, description="attention window in tokens")
    causal_flops: bool = Field(
        default=False, description="MFU convention: count half the attention square (Megatron main) or all"
    )
    stack: str | None = Field(
        default=None, description="training software stack (gpufleet.perf.stacks); None = the reference constants"
    )
    ep_overlap: bool = Field(default=False, description="overlap expert-parallel all-to-all with compute")
    reshard_after_forward: bool = Field(
        default=True, description="FSDP: free gathered weights after forward and gather them again for backward"
    )
    selective_policy: Literal["attention", "op"] = Field(
        default="attention",
        description="what selective recompute recomputes: the attention core (Megatron, Korthikanti 2022) or, per op, "
        "every other matmul and the elementwise ops (torchtitan's op-level selective activation checkpointing)",
    )
    fp8_cache: bool = Field(
        default=True, description="fp8 runs keep linear-layer inputs in fp8 for the backward (Transformer Engine)"
    )
    schedule: Literal["1f1b", "dualpipe"] = Field(
        default="1f1b", description="pipeline schedule: (interleaved) 1F1B, or DualPipe (DeepSeek-V3 section 3.2.2)"
    )
    lean_activations: bool = Field(
        default=False,
        description="recompute norms, latent-attention up-projections and SwiGLU outputs in backward, keep "
        "attention outputs in 1.5 bytes (DeepSeek-V3 sections 3.2.3 and 3.3.2)",
    )
    recompute_modules: tuple[Literal["mla_up_proj", "mlp"], ...] = Field(
        default=(),
        description="Megatron-Core's --recompute-modules beside the attention core under selective recompute (memory "
        "only, like lean_activations): 'mla_up_proj' keeps latent attention's compressed latents, not its per-head Q, "
        "K and V; 'mlp' keeps a dense layer's MLP input only",
    )
    optimizer_bytes: float = Field(
        default=12.0,
        gt=0,
        description="optimizer bytes per parameter: fp32 master + Adam moments (8: bf16 moments; 6: bf16 master and "
        "moments, Apex DistributedFusedAdam with dtype: bf16)",
    )
    sharded_fp32_params: bool = Field(
        default=False,
        description="ZeRO-3 keeps each parameter's fp32 shard as the optimizer's master copy and no persistent bf16 "
        "shard (PyTorch FSDP / FSDP2 mixed precision: the bf16 copy exists only while gathered): (4 + o)/d bytes per "
        "parameter instead of (6 + o)/d (revision 9)",
    )

    @classmethod
    def megascale(cls, **overrides: object) -> TrainOptions:
        """MegaScale's optimisations on top of the defaults."""
        base = {
            "tp_overlap": True,
            "pp_overlap": True,
            "dp_overlap": True,
            "parallel_block": True,
            "fused_ops": True,
        }
        base.update(overrides)
        return cls(**base)


class Layout(BaseModel):
    """A parallel layout: TP x PP x DP x CP ranks, micro-batch size, virtual stages, recomputation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    dp: int = Field(default=1, gt=0)
    cp: int = Field(default=1, gt=0)
    mbs: int = Field(default=1, gt=0, description="micro-batch size in sequences")
    vp: int = Field(default=1, gt=0, description="virtual pipeline stages per rank (interleaved 1F1B)")
    recompute: Recompute = "none"
    ep: int = Field(default=1, gt=0, description="expert-parallel degree, carved out of DP x CP (MoE models)")

    @property
    def gpus(self) -> int:
        """GPUs the layout occupies: tp x pp x dp x cp."""
        return self.tp * self.pp * self.dp * self.cp

    def describe(self) -> str:
        """Compact text, e.g. 'TP8 PP8 DP16 CP1 mbs1 v6 selective' (' EP64' after CP for expert parallelism)."""
        ep = f" EP{self.ep}" if self.ep > 1 else ""
        return f"TP{self.tp} PP{self.pp} DP{self.dp} CP{self.cp}{ep} mbs{self.mbs} v{self.vp} {self.recompute}"
