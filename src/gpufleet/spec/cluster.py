"""The cluster description: pools of identical GPU nodes, and the network that joins their racks.

A ``ClusterSpec`` is immutable and hashable, so it can key caches and travel to worker processes.
GPU and NIC names are checked against the catalogs and stored in their canonical spelling.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpufleet.errors import SpecError
from gpufleet.spec.catalog import get_gpu, get_nic, gpu_catalog, nic_catalog
from gpufleet.spec.hardware import GPUSpec, NICSpec

__all__ = ["ClusterSpec", "Network", "Pool", "PoolKind"]

_FROZEN = ConfigDict(extra="forbid", frozen=True)

#: What a pool is for. Baseline scheduling policies place jobs on training pools only.
PoolKind = Literal["training", "inference"]
_KINDS: tuple[str, ...] = ("training", "inference")


class Pool(BaseModel):
    """A set of identical nodes: ``nodes`` machines with ``gpus_per_node`` GPUs and ``nics_per_node`` NICs.

    Nodes sit in racks of ``nodes_per_rack``; the last rack may be partly filled.
    """

    model_config = _FROZEN

    name: str = Field(min_length=1)
    kind: PoolKind
    gpu: str = Field(description="GPU catalog key (aliases accepted, stored canonical)")
    gpus_per_node: int = Field(default=8, gt=0)
    nodes: int = Field(gt=0)
    nic: str = Field(default="ib-hdr", description="NIC catalog key (aliases accepted, stored canonical)")
    nics_per_node: int = Field(default=1, gt=0)
    nodes_per_rack: int = Field(default=16, gt=0)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        try:
            return gpu_catalog().resolve(value)
        except SpecError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("nic")
    @classmethod
    def _known_nic(cls, value: str) -> str:
        try:
            return nic_catalog().resolve(value)
        except SpecError as exc:
            raise ValueError(str(exc)) from None

    @property
    def total_gpus(self) -> int:
        """GPUs in the pool: nodes x gpus_per_node."""
        return self.nodes * self.gpus_per_node

    @property
    def racks(self) -> int:
        """Racks the pool occupies (a partly filled last rack counts)."""
        return math.ceil(self.nodes / self.nodes_per_rack)

    @property
    def gpu_spec(self) -> GPUSpec:
        """The catalog entry of the pool's GPU."""
        return get_gpu(self.gpu)

    @property
    def nic_spec(self) -> NICSpec:
        """The catalog entry of the pool's NIC."""
        return get_nic(self.nic)

    @property
    def node_gbps(self) -> float:
        """Network line rate of one node, Gbit/s (all its NICs)."""
        return self.nics_per_node * self.nic_spec.gbps

    @property
    def rack_downlink_gbps(self) -> float:
        """Line rate of a full rack's nodes into their top-of-rack switch, Gbit/s."""
        return self.nodes_per_rack * self.node_gbps


class Network(BaseModel):
    """The fabric above the racks: how oversubscribed the rack uplinks are, and the spine's capacity."""

    model_config = _FROZEN

    oversubscription: float = Field(
        default=1.0, ge=1.0, description="rack downlink bandwidth / rack uplink-to-spine bandwidth"
    )
    spine_gbps: float | None = Field(
        default=None, gt=0, description="total capacity of the spine layer, Gbit/s; None: non-blocking"
    )

    def rack_uplink_gbps(self, pool: Pool) -> float:
        """Bandwidth from one rack of ``pool`` to the spine, Gbit/s: downlink / oversubscription."""
        return pool.rack_downlink_gbps / self.oversubscription


class ClusterSpec(BaseModel):
    """A whole cluster: named pools (at least one, unique names) and the network between racks."""

    model_config = _FROZEN

    name: str = Field(min_length=1)
    pools: tuple[Pool, ...] = Field(min_length=1)
    network: Network = Network()

    @field_validator("pools")
    @classmethod
    def _unique_pool_names(cls, pools: tuple[Pool, ...]) -> tuple[Pool, ...]:
        first: dict[str, int] = {}
        for i, pool in enumerate(pools):
            if pool.name in first:
                raise ValueError(
                    f"pool name {pool.name!r} is used by pools[{first[pool.name]}] and pools[{i}]; "
                    "give each pool a unique name"
                )
            first[pool.name] = i
        return pools

    @property
    def training_pools(self) -> tuple[Pool, ...]:
        """Pools of kind "training", in file order."""
        return tuple(p for p in self.pools if p.kind == "training")

    @property
    def inference_pools(self) -> tuple[Pool, ...]:
        """Pools of kind "inference", in file order."""
        return tuple(p for p in self.pools if p.kind == "inference")

    def pool(self, name: str) -> Pool:
        """The pool called ``name``; SpecError listing the pool names if there is none."""
        for p in self.pools:
            if p.name == name:
                return p
        names = ", ".join(p.name for p in self.pools)
        raise SpecError(f"cluster {self.name!r} has no pool {name!r}; its pools are: {names}")

    def total_gpus(self, kind: str | None = "training") -> int:
        """GPUs in pools of ``kind`` ("training" or "inference"), or in all pools if ``kind`` is None."""
        if kind is None:
            return sum(p.total_gpus for p in self.pools)
        if kind not in _KINDS:
            raise SpecError(f"unknown pool kind {kind!r}; use 'training', 'inference' or None for all")
        return sum(p.total_gpus for p in self.pools if p.kind == kind)

    def resized(self, training_gpus: int) -> ClusterSpec:
        """A copy whose training pools hold at least ``training_gpus`` GPUs, in whole nodes.

        Each training pool is scaled by the same factor; rounding hands the spare nodes to the pools
        with the largest fractional remainder, so the total overshoots by less than one node unless
        a pool must keep its minimum of one node. Inference pools and the network are unchanged.
        """
        if isinstance(training_gpus, bool) or not isinstance(training_gpus, int) or training_gpus <= 0:
            raise SpecError(f"resized: training GPU count must be a positive whole number, got {training_gpus!r}")
        training = [i for i, p in enumerate(self.pools) if p.kind == "training"]
        if not training:
            raise SpecError(f'cluster {self.name!r} has no training pool to resize; add a pool with kind = "training"')
        factor = Fraction(training_gpus, self.total_gpus("training"))
        ideal = {i: self.pools[i].nodes * factor for i in training}
        nodes = {i: max(1, math.floor(ideal[i])) for i in training}

        def total() -> int:
            return sum(nodes[i] * self.pools[i].gpus_per_node for i in training)

        # Largest remainder first; ties go to the earlier pool. Each pool gains at most one node.
        order = sorted(training, key=lambda i: (-(ideal[i] - nodes[i]), i))
        for i in order:
            if total() >= training_gpus:
                break
            nodes[i] += 1
        pools = tuple(p.model_copy(update={"nodes": nodes[i]}) if i in nodes else p for i, p in enumerate(self.pools))
        return self.model_copy(update={"pools": pools})

    @classmethod
    def single_pool(
        cls, gpus: int, gpu: str = "v100", gpus_per_node: int = 8, name: str = "custom", nic: str = "ib-hdr"
    ) -> ClusterSpec:
        """A training-only cluster of ceil(gpus / gpus_per_node) nodes in one pool called "train"."""
        for label, value in (("gpus", gpus), ("gpus_per_node", gpus_per_node)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecError(f"single_pool: {label} must be a positive whole number, got {value!r}")
        gpu = gpu_catalog().resolve(gpu)
        nic = nic_catalog().resolve(nic)
        nodes = math.ceil(gpus / gpus_per_node)
        try:
            pool = Pool(name="train", kind="training", gpu=gpu, gpus_per_node=gpus_per_node, nodes=nodes, nic=nic)
            return cls(name=name, pools=(pool,))
        except ValidationError as exc:
            raise SpecError(f"single_pool: {exc.errors(include_url=False)[0]['msg']}") from None
