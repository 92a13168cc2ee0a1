"""The paged KV cache: one pool of fixed-size blocks per layer, handed out to sequences on demand.

A sequence owns a list of block ids (its block table); token ``t`` of it lives in block ``table[t // B]`` at
offset ``t % B``. Blocks return to the free list when the sequence finishes or is preempted, so memory follows
the tokens actually generated, not the longest possible output (vLLM's and Punica's design).
"""

from __future__ import annotations

import torch

from gpufleet.errors import ServeError


class BlockAllocator:
    """Free-list of block ids; no tensors, so the scheduler can plan admissions cheaply."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ServeError(
                f"KV cache needs at least one block of at least one token (got {num_blocks} x "
                f"{block_size}); raise --kv-blocks"
            )
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise ServeError(f"KV cache exhausted: {n} blocks asked, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def release(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


class KVCache:
    """K and V pools ``[layers, blocks * block_size, kv_heads, head_dim]`` plus the allocator."""

    def __init__(
        self,
        layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = block_size
        shape = (layers, num_blocks * block_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # gather() writes into these, grown as needed and reused by every layer and step: a fresh multi-MB
        # tensor per layer is served by mmap on CPU and faults in its pages each time (a quarter of a batch-32
        # step's time on a 2-core CPU went to page faults)
        self._gather_k = torch.empty(0, dtype=dtype, device=device)
        self._gather_v = torch.empty(0, dtype=dtype, device=device)

    @classmethod
    def for_budget(
        cls,
        layers: int,
        kv_heads: int,
        head_dim: int,
        budget_bytes: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        """As many blocks as fit in ``budget_bytes``."""
        per_block = 2 * layers * block_size * kv_heads * head_dim * torch.finfo(dtype).bits // 8
        return cls(layers, max(1, budget_bytes // per_block), block_size, kv_heads, head_dim, dtype, device)

    def slots(self, table: list[int], start: int, count: int) -> torch.Tensor:
        """Flat pool positions of tokens ``start .. start + count - 1`` of a sequence with block ``table``."""
        pos = torch.arange(start, start + count)
        blocks = torch.tensor(table, dtype=torch.long)[pos // self.block_size]
        return blocks * self.block_size + pos % self.block_size

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def gather(self, layer: int, slot_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at pool positions ``slot_table`` [D, T] -> [D, T, kv_heads, head_dim] each.

        The results are views of buffers that the next call overwrites: use them before gathering again."""
        flat = slot_table.reshape(-1)
        row = self.k.shape[2:]
        n = flat.numel() * self.k.shape[2] * self.k.shape[3]
        if self._gather_k.numel() < n:
            self._gather_k = torch.empty(n, dtype=self.k.dtype, device=self.k.device)
            self._gather_v = torch.empty(n, dtype=self.v.dtype, device=self.v.device)
        k = self._gather_k[:n].view(flat.numel(), *row)
        v = self._gather_v[:n].view(flat.numel(), *row)
        torch.index_select(self.k[layer], 0, flat, out=k)
        torch.index_select(self.v[layer], 0, flat, out=v)
        shape = (*slot_table.shape, *row)
        return k.view(shape), v.view(shape)
