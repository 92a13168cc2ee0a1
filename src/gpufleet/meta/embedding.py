"""One concatenated embedding table with rows sharded across ranks, looked up by all-to-all.

Global id ``g`` lives on rank ``g % world`` at local row ``g // world`` (see ``schema``). A lookup sends each id
to its owner, gathers the rows there and sends the vectors back through a differentiable all-to-all, so the
gradients of every rank's lookups land on the owning shard's ``weight.grad``. The table owns its optimizer
(row-wise sparse Adagrad) because its state is sharded like the rows.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpufleet.errors import MetaError
from gpufleet.meta.comm import ALL_GATHER, AllToAll, CommTimer, all_to_all, default_timer, world_and_rank

INIT_CHUNK_ROWS = 8192  # global rows drawn per generator call; fixed so every world size draws the same table


def local_row_count(num_rows: int, world: int, rank: int) -> int:
    """How many of ``num_rows`` global rows rank ``rank`` owns under ``id % world``."""
    return max(0, (num_rows - rank + world - 1) // world)


def owned_global_ids(num_rows: int, world: int, rank: int) -> torch.Tensor:
    """Global ids of rank ``rank``'s local rows, in local-row order (``rank + r * world``)."""
    return torch.arange(rank, num_rows, world, dtype=torch.int64)


def init_rows(num_rows: int, dim: int, world: int, rank: int, *, std: float, seed: int) -> torch.Tensor:
    """This rank's rows of a N(0, std²) table drawn in global order, identical for every world size."""
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for start in range(0, num_rows, INIT_CHUNK_ROWS):
        chunk = torch.empty(min(INIT_CHUNK_ROWS, num_rows - start), dim).normal_(0.0, std, generator=gen)
        parts.append(chunk[(rank - start) % world :: world])
    return torch.cat(parts) if parts else torch.empty(0, dim)


class ShardedEmbedding(torch.nn.Module):
    """This rank's rows of a ``num_rows × dim`` table; ``lookup`` is a collective over ``group``.

    ``weight`` holds local row ``r`` = global id ``rank + r * world``; ``adagrad_sum`` is the per-element
    Adagrad accumulator of the same shape (not in ``state_dict``: save it with ``checkpoint.save_checkpoint``).
    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        *,
        init_std: float = 0.01,
        seed: int = 0,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        timer: CommTimer | None = None,
    ) -> None:
        super().__init__()
        if num_rows < 1 or dim < 1:
            raise MetaError(
                f"embedding table needs num_rows >= 1 and dim >= 1, got {num_rows} x {dim}; "
                "check num_rows in the prepared folder's meta.json and the embedding dim option"
            )
        self.num_rows, self.dim = int(num_rows), int(dim)
        self.group = group
        self.world, self.rank = world_and_rank(group)
        self.timer = default_timer() if timer is None else timer
        rows = init_rows(self.num_rows, self.dim, self.world, self.rank, std=init_std, seed=seed)
        self.weight = torch.nn.Parameter(rows.to(device))
        self.register_buffer("adagrad_sum", torch.zeros_like(self.weight.detach()), persistent=False)

    def extra_repr(self) -> str:
        return f"num_rows={self.num_rows}, dim={self.dim}, world={self.world}, rank={self.rank}"

    @property
    def num_local(self) -> int:
        return int(self.weight.shape[0])

    def global_ids(self) -> torch.Tensor:
        """Global ids of this rank's rows, in local-row order (on CPU)."""
        return owned_global_ids(self.num_rows, self.world, self.rank)

    # ----------------------------------------------------------------------------------------- lookup
    def lookup(self, ids: torch.Tensor, peer_ids: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Vectors ``[N, dim]`` of global ``ids`` ``[N]`` (duplicates and N = 0 allowed), differentiable.

        ``peer_ids`` (optional): the ids every rank passes to this same call (``peer_ids[rank]`` is ``ids``). When
        the input pipeline knows them (the Meta-IO loader plans every rank's tasks), each rank works out which of
        its rows the others request, and the two exchanges of counts and ids are skipped: only the vectors travel.

        Collective with world > 1: every rank of the group must call ``lookup`` the same number of times, in the
        same order, even with no ids (pass an empty tensor), or the ranks hang.
        """
        ids = self._check_ids(ids)
        if self.world == 1:
            return F.embedding(ids, self.weight)
        owner = ids % self.world
        order = torch.argsort(owner, stable=True)
        in_splits = torch.bincount(owner, minlength=self.world)
        in_list = in_splits.tolist()
        if peer_ids is None:
            out_splits = torch.empty_like(in_splits)
            self._exchange(out_splits, in_splits)
            out_list = out_splits.tolist()
            recv_ids = self._exchange(ids.new_empty(sum(out_list)), ids[order], out_list, in_list)
        else:
            recv_ids, out_list = self._requests_from(peer_ids)
        rows = F.embedding(recv_ids // self.world, self.weight)
        back = AllToAll.apply(rows, in_list, out_list, self.group, self.timer)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        return back.index_select(0, inverse)

    def _requests_from(self, peer_ids: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """The ids that every rank requests from this one, in the order it sends them (its owner-sorted order)."""
        if len(peer_ids) != self.world:
            raise ValueError(f"peer_ids has {len(peer_ids)} entries for a world of {self.world}")
        wanted = [torch.as_tensor(p, dtype=torch.int64) for p in peer_ids]
        mine = [p[p % self.world == self.rank] for p in wanted]
        return torch.cat(mine).to(self.weight.device), [int(m.numel()) for m in mine]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Same as ``lookup`` (a collective)."""
        return self.lookup(ids)

    def _check_ids(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"lookup needs a 1-D integer id tensor, got {tuple(ids.shape)} {ids.dtype}")
        ids = ids.to(device=self.weight.device, dtype=torch.int64)
        lo, hi = (int(v) for v in torch.aminmax(ids)) if ids.numel() else (0, 0)
        if lo < 0 or hi >= self.num_rows:
            bad = lo if lo < 0 else hi
            raise MetaError(
                f"embedding id {bad} is outside the table's {self.num_rows} rows: the task records do "
                "not match this model; check num_rows in the prepared folder's meta.json or re-run "
                "prepare"
            )
        return ids

    def _exchange(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int] | None = None,
        in_splits: list[int] | None = None,
    ) -> torch.Tensor:
        return all_to_all(out, inp, out_splits, in_splits, group=self.group, timer=self.timer)

    # -------------------------------------------------------------------------------------- optimizer
    @torch.no_grad()
    def step(self, lr: float, eps: float = 1e-10) -> int:
        """Row-wise sparse Adagrad on the rows whose gradient is non-zero; returns how many rows moved.

        Per element: ``sum += g²; w -= lr * g / (sqrt(sum) + eps)``, i.e. ``torch.optim.Adagrad`` restricted
        to touched rows (untouched rows would not move there either). Local: no communication.
        """
        grad = self.weight.grad
        if grad is None:
            return 0
        if grad.is_sparse:
            grad = grad.coalesce().to_dense()
        rows = grad.ne(0).any(dim=1).nonzero().squeeze(1)
        if rows.numel() == 0:
            return 0
        g = grad.index_select(0, rows)
        acc = self.adagrad_sum.index_select(0, rows).addcmul_(g, g)
        self.adagrad_sum.index_copy_(0, rows, acc)
        new = self.weight.index_select(0, rows).addcdiv_(g, acc.sqrt().add_(eps), value=-lr)
        self.weight.index_copy_(0, rows, new)
        return int(rows.numel())

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) this shard's gradient before the next meta-step."""
        if set_to_none:
            self.weight.grad = None
        elif self.weight.grad is not None:
            self.weight.grad.zero_()

    # ------------------------------------------------------------------------------------ full tables
    def full_table(self) -> torch.Tensor:
        """All ``num_rows`` rows in global order on every rank (collective; for evaluation and export)."""
        return self._gather_rows(self.weight.detach())

    def full_adagrad_sum(self) -> torch.Tensor:
        """The Adagrad accumulator of all rows in global order on every rank (collective)."""
        return self._gather_rows(self.adagrad_sum)

    @torch.no_grad()
    def load_full_table(self, table: torch.Tensor, state: torch.Tensor | None = None) -> None:
        """Keep this rank's rows of a full ``num_rows × dim`` table (and Adagrad sum; None resets it to 0)."""
        for name, t in (("table", table), ("adagrad state", state)):
            if t is not None and tuple(t.shape) != (self.num_rows, self.dim):
                raise MetaError(
                    f"{name} has shape {tuple(t.shape)} but this model's embedding is "
                    f"{self.num_rows} x {self.dim}; load a file exported for the same prepared folder"
                )
        self.weight.copy_(table[self.rank :: self.world])
        if state is None:
            self.adagrad_sum.zero_()
        else:
            self.adagrad_sum.copy_(state[self.rank :: self.world])

    def _gather_rows(self, local: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return local.detach().clone()
        per_rank = math.ceil(self.num_rows / self.world)
        padded = local.new_zeros(per_rank, self.dim)
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        with self.timer.timed(ALL_GATHER, padded):
            dist.all_gather(parts, padded, group=self.group)
        full = local.new_empty(self.num_rows, self.dim)
        for r, part in enumerate(parts):
            full[r :: self.world] = part[: local_row_count(self.num_rows, self.world, r)]
        return full
