"""The shared vocabulary of gpufleet: GPU and NIC catalogs, pools, networks and cluster files.

Depends on nothing else in gpufleet except ``gpufleet.errors``; every other package may use it.
Catalog files are read lazily, on the first lookup.
"""

from gpufleet.spec.catalog import Catalog, get_gpu, get_nic, gpu_catalog, gpu_names, nic_catalog, nic_names
from gpufleet.spec.cluster import ClusterSpec, Network, Pool, PoolKind
from gpufleet.spec.hardware import GPUSpec, NICSpec, Precision
from gpufleet.spec.loader import cluster_from_dict, cluster_to_dict, default_cluster_path, load_cluster

__all__ = [
    "Catalog",
    "ClusterSpec",
    "GPUSpec",
    "NICSpec",
    "Network",
    "Pool",
    "PoolKind",
    "Precision",
    "cluster_from_dict",
    "cluster_to_dict",
    "default_cluster_path",
    "get_gpu",
    "get_nic",
    "gpu_catalog",
    "gpu_names",
    "load_cluster",
    "nic_catalog",
    "nic_names",
]
