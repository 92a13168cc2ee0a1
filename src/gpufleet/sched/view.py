"""What a policy may read of the simulator: read-only Protocols that ``sched`` defines for itself.

``sched`` never imports ``gpufleet.sim``; both simulators (gang and elastic) satisfy these Protocols
structurally. Besides reading, a policy may only ask for timers and re-keying (``add_timer``, ``rekey_*``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

#: GPUs taken on each node: ``[(node, count), ...]``.
Allocation = list[tuple[int, int]]


class PlacementSettings(Protocol):
    """The run settings a policy reads."""

    @property
    def placement(self) -> str: ...  # "consolidate" or "spread"

    @property
    def strict_placement(self) -> bool: ...

    @property
    def placement_penalty(self) -> float: ...


class PartitionView(Protocol):
    """One partition's free GPUs per node, and the two ways a policy takes GPUs from it."""

    @property
    def gpus_per_node(self) -> int: ...

    @property
    def nodes(self) -> int: ...

    @property
    def total_free(self) -> int: ...

    @property
    def free(self) -> list[int]: ...  # free GPUs per node

    @property
    def buckets(self) -> list[dict[int, None]]: ...  # buckets[k]: the nodes with k free GPUs

    def allocate(self, gpus: int, placement: str, strict: bool) -> Allocation | None: ...

    def take(self, alloc: Sequence[tuple[int, int]]) -> Allocation: ...

    def _plan_consolidate(self, gpus: int) -> Allocation: ...

    def _best_fit_node(self, gpus: int) -> int | None: ...  # the node with the fewest free GPUs that holds ``gpus``


class NetworkView(Protocol):
    """The network model's per-node NIC load and the jobs' communication profiles."""

    comm: Any  # per-job communication profiles and scales
    model: Any  # the contention model (sensitivity, intensity)
    load: list[float]
    uplink: list[bool]

    def nic_gbps(self, p: int) -> float: ...

    def nic_load(self, p: int, node: int) -> float: ...

    def lost(self, j: int) -> float: ...  # throughput share running job j is losing to contention now


class OrderView(Protocol):
    """What a placement may read of the order (the policy) it runs under: its name and its traits."""

    @property
    def name(self) -> str: ...

    @property
    def ranks_by_service(self) -> bool: ...  # jobs ranked by the service they have attained (LAS, Tiresias)


class SimView(Protocol):
    """The job arrays, clock and queues a policy reads (indexed by job number ``j``)."""

    n: int
    now: float
    config: PlacementSettings
    workload: Any  # the job table, columnar (``.gpus`` is an array)
    parts: Sequence[PartitionView]
    network: NetworkView | None
    submit: Sequence[float]
    duration: Sequence[float]
    gpus: Sequence[int]
    remaining: Sequence[float]
    attained: Sequence[float]
    expected_finish: Sequence[float]
    held_s: Sequence[float]
    finish: Sequence[float]  # completion time, NaN until the job finishes
    busy: int
    total_gpus: int
    n_running: int
    n_waiting: int
    waiting_gpus: int

    def progress_now(self, j: int, now: float) -> float: ...

    def worker_gpus(self, j: int) -> int: ...  # GPUs a node's share of job j must be a multiple of (1: any split)

    def attained_now(self, j: int, now: float) -> float: ...

    def running_jobs(self) -> list[int]: ...

    def best_waiting_key(self) -> float | None: ...

    def add_timer(self, when: float, j: int, tag: int) -> None: ...

    def rekey_running(self, j: int) -> None: ...

    def rekey_waiting(self, j: int) -> None: ...
