"""The machine a training job runs on, as the performance model sees it: GPU, node, NICs, fabric.

``System`` is built from flags (``--gpu a100-80g --nic roce-200g --nics-per-node 8``) or from a pool of
a cluster file, whose rack size and spine oversubscription then apply to groups that leave a rack.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.errors import SpecError
from gpufleet.spec import ClusterSpec, get_gpu, get_nic
from gpufleet.spec.hardware import GPUSpec, NICSpec

__all__ = ["System"]

#: Usable PCIe x16 bandwidth per direction, GB/s, by generation (128b/130b coding, TLP overhead).
_PCIE_GBPS = {3: 13.0, 4: 26.0, 5: 52.0, 6: 104.0}


@dataclass(frozen=True)
class System:
    """GPUs of one kind in nodes of ``gpus_per_node``, with ``nics_per_node`` NICs each.

    ``rack_gpus`` GPUs share a full-bisection domain (a rack or a pod); traffic of a group wider than
    that crosses links ``oversubscription`` times thinner.
    """

    gpu: GPUSpec
    nic: NICSpec
    gpus_per_node: int = 8
    nics_per_node: float = 8  # may be fractional: a job's share of a node's NICs
    rack_gpus: int | None = None
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.nics_per_node <= 0:
            raise SpecError("gpus_per_node must be at least 1 and nics_per_node positive")
        if self.oversubscription < 1.0:
            raise SpecError(f"oversubscription must be >= 1 (1 = non-blocking), got {self.oversubscription}")

    @classmethod
    def build(
        cls,
        gpu: str,
        nic: str = "ib-hdr",
        gpus_per_node: int = 8,
        nics_per_node: float = 8,
        rack_gpus: int | None = None,
        oversubscription: float = 1.0,
    ) -> System:
        """A system from catalog names (aliases accepted)."""
        return cls(get_gpu(gpu), get_nic(nic), gpus_per_node, nics_per_node, rack_gpus, oversubscription)

    @classmethod
    def from_cluster(cls, cluster: ClusterSpec, pool: str | None = None) -> System:
        """The system of one pool of ``cluster`` (the first training pool by default)."""
        chosen = cluster.pool(pool) if pool else (cluster.training_pools or cluster.pools)[0]
        return cls(
            chosen.gpu_spec,
            chosen.nic_spec,
            chosen.gpus_per_node,
            chosen.nics_per_node,
            chosen.nodes_per_rack * chosen.gpus_per_node,
            cluster.network.oversubscription,
        )

    @property
    def intra_node_bytes_per_s(self) -> float:
        """Per-GPU, per-direction peak bandwidth inside a node: NVLink, else PCIe."""
        if self.gpu.nvlink_gbps > 0:
            return self.gpu.nvlink_gbps / 2 * 1e9
        return _PCIE_GBPS.get(self.gpu.pcie_gen, 26.0) * 1e9

    @property
    def nic_bytes_per_gpu(self) -> float:
        """Per-GPU share of the node's NIC line rate, bytes/s per direction, when all GPUs talk at once."""
        return self.nics_per_node * self.nic.gbps / 8 * 1e9 / self.gpus_per_node

    def describe(self) -> str:
        """One line for reports: '8x A100-80G per node, 8x RoCE v2 200 Gb/s'."""
        return f"{self.gpus_per_node}x {self.gpu.name} per node, {self.nics_per_node:g}x {self.nic.display_name}" + (
            f", 1:{self.oversubscription:g} above {self.rack_gpus} GPUs" if self.oversubscription > 1 else ""
        )
