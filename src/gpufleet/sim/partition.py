"""Node-level GPU allocation for one partition (the nodes of one GPU type): which GPUs of which node a job holds.

Nodes are kept in buckets by their number of free GPUs, so best-fit, worst-fit and "any whole node" lookups
cost O(GPUs per node) instead of O(nodes): the simulator calls them on every start and completion.
"""

from __future__ import annotations

from collections.abc import Sequence

#: An allocation: (node index within the partition, GPUs taken on that node) pairs.
Allocation = list[tuple[int, int]]


class Partition:
    """Free-GPU bookkeeping of ``nodes`` identical nodes with ``gpus_per_node`` GPUs each."""

    __slots__ = ("buckets", "free", "gpu_type", "gpus_per_node", "name", "nodes", "total", "total_free")

    def __init__(self, name: str, gpu_type: str, nodes: int, gpus_per_node: int) -> None:
        self.name = name
        self.gpu_type = gpu_type
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.total = nodes * gpus_per_node
        self.total_free = self.total
        self.free = [gpus_per_node] * nodes
        # buckets[k]: the nodes with exactly k free GPUs; dicts keep insertion order, so choices are deterministic
        self.buckets: list[dict[int, None]] = [{} for _ in range(gpus_per_node + 1)]
        self.buckets[gpus_per_node] = dict.fromkeys(range(nodes))

    # -- queries ---------------------------------------------------------------------------------
    def ideal_nodes(self, gpus: int) -> int:
        """Fewest nodes a job of ``gpus`` GPUs can span on this partition."""
        return -(-gpus // self.gpus_per_node)

    def fits(self, gpus: int, strict: bool) -> bool:
        """Whether a job of ``gpus`` GPUs can start now; ``strict`` demands a placement on the fewest nodes."""
        if gpus > self.total_free:
            return False
        if not strict:
            return True
        g = self.gpus_per_node
        whole, rest = divmod(gpus, g)
        full_nodes = len(self.buckets[g])
        if full_nodes < whole:
            return False
        if rest == 0:
            return True
        if full_nodes > whole:
            return True
        return any(self.buckets[k] for k in range(rest, g))

    # -- mutations -------------------------------------------------------------------------------
    def _take(self, node: int, count: int) -> None:
        before = self.free[node]
        del self.buckets[before][node]
        self.free[node] = before - count
        self.buckets[before - count][node] = None

    def _best_fit_node(self, gpus: int) -> int | None:
        """The node with the fewest free GPUs that still has ``gpus`` free."""
        for k in range(gpus, self.gpus_per_node + 1):
            bucket = self.buckets[k]
            if bucket:
                return next(iter(bucket))
        return None

    def allocate(self, gpus: int, placement: str, strict: bool) -> Allocation | None:
        """Take ``gpus`` GPUs with ``placement`` ("consolidate" or "spread"); None if impossible."""
        if not self.fits(gpus, strict):
            return None
        alloc = self._plan_spread(gpus) if placement == "spread" else self._plan_consolidate(gpus)
        for node, count in alloc:
            self._take(node, count)
        self.total_free -= gpus
        return alloc

    def _plan_consolidate(self, gpus: int) -> Allocation:
        """Fewest nodes, best fit: whole free nodes first, then the tightest node for the remainder."""
        g = self.gpus_per_node
        if gpus <= g:
            node = self._best_fit_node(gpus)
            if node is not None:
                return [(node, gpus)]
            return self._plan_largest_first(gpus)
        whole, rest = divmod(gpus, g)
        full = self.buckets[g]
        if len(full) >= whole:
            it = iter(full)
            alloc = [(next(it), g) for _ in range(whole)]
            if rest:
                taken = {n for n, _ in alloc}
                node = None
                for k in range(rest, g + 1):
                    for candidate in self.buckets[k]:
                        if candidate not in taken:
                            node = candidate
                            break
                    if node is not None:
                        break
                if node is None:
                    return self._plan_largest_first(gpus)
                alloc.append((node, rest))
            return alloc
        return self._plan_largest_first(gpus)

    def _plan_largest_first(self, gpus: int) -> Allocation:
        """Fragmented fallback: fill from the nodes with most free GPUs, which keeps the node count low."""
        alloc: Allocation = []
        need = gpus
        for k in range(self.gpus_per_node, 0, -1):
            for node in self.buckets[k]:
                take = k if k < need else need
                alloc.append((node, take))
                need -= take
                if need == 0:
                    return alloc
        raise AssertionError("fits() said yes but the free GPUs do not add up")  # pragma: no cover

    def _plan_spread(self, gpus: int) -> Allocation:
        """Worst fit: one GPU per node over as many nodes as possible, emptiest nodes first."""
        order: list[int] = []
        for k in range(self.gpus_per_node, 0, -1):
            order.extend(self.buckets[k])
            if len(order) >= gpus:
                break
        counts = dict.fromkeys(order, 0)
        need = gpus
        while need:
            for node in order:
                if counts[node] < self.free[node]:
                    counts[node] += 1
                    need -= 1
                    if need == 0:
                        break
        return [(node, c) for node, c in counts.items() if c]

    def take(self, alloc: Sequence[tuple[int, int]]) -> Allocation:
        """Take exactly the GPUs of ``alloc`` (a placement chosen by a policy); ValueError if they are not free."""
        for node, count in alloc:
            if count <= 0 or self.free[node] < count:
                raise ValueError(f"node {node} has {self.free[node]} free GPUs, not {count}")
        out = [(int(node), int(count)) for node, count in alloc]
        for node, count in out:
            self._take(node, count)
        self.total_free -= sum(c for _, c in out)
        return out

    def release(self, alloc: Sequence[tuple[int, int]]) -> None:
        """Give the GPUs of ``alloc`` back."""
        total = 0
        for node, count in alloc:
            before = self.free[node]
            del self.buckets[before][node]
            self.free[node] = before + count
            self.buckets[before + count][node] = None
            total += count
        self.total_free += total

    def check(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (debug mode)."""
        assert 0 <= self.total_free <= self.total, "free GPUs out of range"
        assert sum(self.free) == self.total_free, "node free counts disagree with the partition total"
        for k, bucket in enumerate(self.buckets):
            for node in bucket:
                assert self.free[node] == k, f"node {node} in bucket {k} has {self.free[node]} free"
        assert sum(len(b) for b in self.buckets) == self.nodes, "a node is missing from the buckets"
