"""Achieved-efficiency constants of the performance model, per GPU generation and per network class.

They live in ``gpufleet/data/perf_efficiency.toml``; ``gpufleet perf calibrate`` refits them from the
published-measurement table, and a user may pass their own file (``--efficiency``).
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.errors import SpecError
from gpufleet.spec._toml import read_toml
from gpufleet.spec._validation import spec_error
from gpufleet.spec.catalog import data_file
from gpufleet.spec.hardware import GPUSpec, NICSpec

__all__ = [
    "ComputeEfficiency",
    "Efficiency",
    "LinkEfficiency",
    "StackConstants",
    "default_efficiency",
    "jobspeed_efficiency",
    "load_efficiency",
]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class ComputeEfficiency(BaseModel):
    """How close one GPU generation gets to its datasheet peaks on each kind of kernel."""

    model_config = _STRICT

    gemm: float = Field(gt=0, le=1)
    gemm_half_width: float = Field(ge=0)
    attention: float = Field(gt=0, le=1)
    flash_attention: float = Field(gt=0, le=1)
    elementwise_bytes: float = Field(ge=0)
    memory: float = Field(gt=0, le=1)
    fp8_gemm: float = Field(ge=0, le=1)
    fp8_cast_bytes: float = Field(
        default=0.0,
        ge=0,
        description="HBM bytes per element that fp8 training's dynamic scaling moves to quantise each GEMM operand "
        "(amax read, cast read + fp8 write, transposed copy); 0 = free (the simulator's frozen file)",
    )

    def gemm_efficiency(self, width):
        """GEMM efficiency for a per-GPU width (hidden / TP): saturates at ``gemm`` for wide matrices."""
        return self.gemm * width / (width + self.gemm_half_width)


class LinkEfficiency(BaseModel):
    """Achieved fraction of line rate and per-step latency of one network class."""

    model_config = _STRICT

    efficiency: float = Field(gt=0, le=1)
    alpha_us: float = Field(ge=0)


class IntraNodeEfficiency(BaseModel):
    """NVLink / PCIe collectives inside a node."""

    model_config = _STRICT

    nvlink: float = Field(gt=0, le=1)
    pcie: float = Field(gt=0, le=1)
    alpha_us: float = Field(ge=0)


class SoftwareConstants(BaseModel):
    """Constants of the training software's methods (overlap, fusion), not of the hardware."""

    model_config = _STRICT

    tp_overlap_exposed: float = Field(ge=0, le=1)
    pp_overlap_exposed: float = Field(ge=0, le=1)
    dp_overlap_window: float = Field(ge=0)
    fused_elementwise: float = Field(ge=0, le=1)
    step_overhead_s: float = Field(ge=0)
    layer_overhead_us: float = Field(ge=0)
    fp8_layer_overhead_us: float = Field(default=0.0, ge=0)  # fp8 scaling kernels of a layer (revision 7)
    memory_reserve_gb: float = Field(ge=0)
    ep_overlap_exposed: float = Field(default=0.25, ge=0, le=1)
    overlap_comm_sm_share: float = Field(default=0.15, ge=0, lt=1)
    revision: int = Field(
        default=1,
        ge=1,
        le=3,
        description="model structure: 1 as frozen for the simulator's job speeds; 2 adds per-op activation "
        "inventories, per-stage pipeline memory and GiB capacities; 3 adds the HBM writes of GEMM outputs "
        "(gpufleet.perf.gemm_io) in place of a fitted narrow-width curve",
    )


class StackConstants(BaseModel):
    """Constants of one training stack, relative to the reference stack (Megatron-Core = 1)."""

    model_config = _STRICT

    compute: float = Field(default=1.0, gt=0, le=2, description="achieved compute rate vs the reference stack")
    fp8: float = Field(default=1.0, gt=0, le=2, description="achieved fp8 GEMM rate vs the generation's fp8_gemm")


class Efficiency(BaseModel):
    """All achieved-efficiency constants: per generation, intra-node, per network class, software, stack."""

    model_config = _STRICT

    compute: dict[str, ComputeEfficiency]
    intra: IntraNodeEfficiency
    network: dict[str, LinkEfficiency]
    software: SoftwareConstants
    stack: dict[str, StackConstants] = Field(default_factory=dict)

    def for_gpu(self, gpu: GPUSpec) -> ComputeEfficiency:
        """Constants of ``gpu``'s generation, or the uncalibrated defaults."""
        return self.compute.get(gpu.arch) or self.compute["default"]

    def for_nic(self, nic: NICSpec) -> LinkEfficiency:
        """Constants of ``nic``'s class (infiniband, roce, ethernet)."""
        return self.network.get(nic.kind) or LinkEfficiency(efficiency=nic.efficiency, alpha_us=nic.latency_us)


def load_efficiency(path: str | Path) -> Efficiency:
    """Read and validate an efficiency TOML file; SpecError names the bad key."""
    data = read_toml(path, what="efficiency file")
    try:
        eff = Efficiency.model_validate(data)
    except ValidationError as exc:
        raise spec_error(exc, str(path), Efficiency) from None
    if "default" not in eff.compute:
        raise SpecError(f"{path}: [compute.default] is missing; it covers GPU generations without their own table")
    return eff


@functools.cache
def default_efficiency() -> Efficiency:
    """The shipped constants (``gpufleet/data/perf_efficiency.toml``)."""
    return load_efficiency(data_file("perf_efficiency.toml"))


@functools.cache
def jobspeed_efficiency() -> Efficiency:
    """The constants the simulator's job-speed model runs on (``perf_efficiency_jobspeed.toml``): frozen, so
    that refitting the validation constants does not move simulated job speeds."""
    return load_efficiency(data_file("perf_efficiency_jobspeed.toml"))
