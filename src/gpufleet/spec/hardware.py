"""GPU and NIC specifications: the datasheet numbers every model in gpufleet starts from.

Instances come from the shipped catalogs (``gpus.toml``, ``nics.toml``); see ``gpufleet.spec.catalog``.
Units are in the field names: TFLOP/s, GB (10^9 bytes), GB/s, Gbit/s, microseconds, watts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_FROZEN = ConfigDict(extra="forbid", frozen=True)

#: Numeric formats ``GPUSpec.dense_tflops`` understands.
Precision = Literal["fp8", "bf16", "fp16", "tf32", "fp32"]


class GPUSpec(BaseModel):
    """One GPU model's peak numbers from its NVIDIA datasheet (dense, i.e. without 2:4 sparsity)."""

    model_config = _FROZEN

    name: str = Field(min_length=1, description="catalog key, e.g. 'a100-80g'")
    display_name: str = Field(min_length=1, description="marketing name, e.g. 'NVIDIA A100 SXM4 80GB'")
    aliases: tuple[str, ...] = Field(default=(), description="other spellings accepted by get_gpu")
    arch: Literal["pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"] = Field(
        description="GPU generation; performance models key achieved-efficiency constants on it"
    )
    dense_fp8_tflops: float | None = Field(default=None, gt=0, description="None: no fp8 tensor cores (pre-Ada)")
    dense_bf16_tflops: float | None = Field(default=None, gt=0, description="None: no bf16 support")
    dense_fp16_tflops: float = Field(gt=0, description="fp16 tensor-core peak (plain fp16 without them)")
    tf32_tflops: float | None = Field(default=None, gt=0, description="None: no TF32 (pre-Ampere)")
    fp32_tflops: float = Field(gt=0, description="non-tensor FP32 peak")
    memory_gb: float = Field(gt=0)
    memory_bw_gbps: float = Field(gt=0, description="HBM/GDDR bandwidth in GB/s")
    nvlink_gbps: float = Field(ge=0, description="GB/s per GPU, total bidirectional; 0 for PCIe-only cards")
    pcie_gen: int = Field(ge=1)
    tdp_w: float = Field(gt=0)
    source: str = Field(min_length=1, description="datasheet the numbers come from")

    @property
    def mixed_precision_tflops(self) -> float:
        """Peak of the 16-bit format used for mixed-precision training: bf16 if supported, else fp16."""
        return self.dense_bf16_tflops if self.dense_bf16_tflops is not None else self.dense_fp16_tflops

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes (decimal GB, as datasheets count)."""
        return self.memory_gb * 1e9

    @property
    def has_nvlink(self) -> bool:
        """True for SXM parts whose GPUs talk over NVLink rather than PCIe."""
        return self.nvlink_gbps > 0

    def dense_tflops(self, precision: Precision) -> float:
        """Dense peak TFLOP/s in ``precision``; raises ValueError where the GPU lacks that format."""
        value = {
            "fp8": self.dense_fp8_tflops,
            "bf16": self.dense_bf16_tflops,
            "fp16": self.dense_fp16_tflops,
            "tf32": self.tf32_tflops,
            "fp32": self.fp32_tflops,
        }.get(precision)
        if value is None:
            raise ValueError(f"GPU {self.name!r} has no {precision} peak (unsupported or unknown format)")
        return value


class NICSpec(BaseModel):
    """One network interface class: line rate plus typical latency and achievable efficiency."""

    model_config = _FROZEN

    name: str = Field(min_length=1, description="catalog key, e.g. 'ib-hdr'")
    display_name: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    kind: Literal["infiniband", "roce", "ethernet"]
    gbps: float = Field(gt=0, description="line rate per port, Gbit/s")
    latency_us: float = Field(gt=0, description="typical one-way small-message latency, microseconds")
    efficiency: float = Field(gt=0, le=1, description="achievable fraction of line rate in large collectives")
    source: str = Field(min_length=1)

    @property
    def effective_gbps(self) -> float:
        """Bandwidth a large collective actually gets, Gbit/s: line rate times efficiency."""
        return self.gbps * self.efficiency

    @property
    def effective_bytes_per_s(self) -> float:
        """``effective_gbps`` in bytes per second, the unit the cost models use."""
        return self.effective_gbps * 1e9 / 8
