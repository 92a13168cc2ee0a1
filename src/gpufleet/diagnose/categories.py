"""Which resource an event spends time on: the category vocabulary of diagnose findings.

A finding names one of these categories, so that an engineer knows where to look: the GPU (or CPU)
compute, the collective communication and its network, host/device copies, the input pipeline, the
host's Python interpreter, or needless host-device synchronisation.
"""

from __future__ import annotations

import polars as pl

COMPUTE = "compute"
COMMUNICATION = "communication"
MEMCPY = "memcpy"
DATA_LOADING = "data_loading"
CPU_STALL = "cpu_stall"
SYNC = "sync"
HANG = "hang"
IDLE = "idle"

CATEGORIES = (COMPUTE, COMMUNICATION, MEMCPY, DATA_LOADING, CPU_STALL, SYNC, HANG, IDLE)

#: Categories an event claims for itself even inside another category's scope ("strong"), e.g. a
#: ``.item()`` inside the forward pass is a sync, a collective inside the optimizer is communication.
STRONG = (COMMUNICATION, SYNC, MEMCPY)

COMM_PATTERN = (
    r"(?i)nccl|gloo|c10d::|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier"
    r"|all_?to_?all|send_?recv|_coalesced_|\bsend\b|\brecv\b|::comm|\bcomm\b"
)
DATA_PATTERN = r"(?i)DataLoader|_DataLoaderIter|data_loading|gpufleet::data"
SYNC_PATTERN = (
    r"^(?:aten::item|aten::_local_scalar_dense|cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize"
    r"|cuStreamSynchronize|cuCtxSynchronize|Stream Sync|Event Sync|Context Sync)$"
)
MEMCPY_PATTERN = r"(?i)^(?:cudaMemcpy|cuMemcpy|Memcpy)"
_HOST_CATS = ["cpu_op", "user_annotation", "gpu_user_annotation", "python_function"]


def category_expr(cat: str = "cat", name: str = "name") -> pl.Expr:
    """The category an event claims from its own kind and name (null when it only inherits its scope's).

    Vectorised over a frame's ``cat`` and ``name`` columns.
    """
    c, n = pl.col(cat), pl.col(name).fill_null("")
    return (
        pl.when(c == "kernel")
        .then(pl.when(n.str.contains(COMM_PATTERN)).then(pl.lit(COMMUNICATION)).otherwise(pl.lit(COMPUTE)))
        .when((c == "gpu_memcpy") | n.str.contains(MEMCPY_PATTERN))
        .then(pl.lit(MEMCPY))
        .when(c == "gpu_memset")
        .then(pl.lit(COMPUTE))
        .when((c == "cuda_sync") | n.str.contains(SYNC_PATTERN))
        .then(pl.lit(SYNC))
        .when(n.str.contains(DATA_PATTERN))
        .then(pl.lit(DATA_LOADING))
        .when(c.is_in(_HOST_CATS) & n.str.contains(COMM_PATTERN))
        .then(pl.lit(COMMUNICATION))
        .otherwise(pl.lit(None, dtype=pl.Utf8))
    )
