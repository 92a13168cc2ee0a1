"""Sharded embedding lookups, gradients, Adagrad and full-table gathers match an unsharded table on 1-4 ranks."""

from __future__ import annotations

import pytest
import torch
from meta_dist_helpers import run_ranks

from gpufleet.errors import MetaError
from gpufleet.meta.comm import CommTimer, all_reduce_sum_, world_and_rank
from gpufleet.meta.embedding import INIT_CHUNK_ROWS, ShardedEmbedding, init_rows, local_row_count

NUM_ROWS, DIM, SEED, LR = 37, 5, 3, 0.1


def close(a: torch.Tensor, b: torch.Tensor, *, exact: bool = False) -> None:
    """Assert equal (``exact``) or equal up to float rounding; cheaper than torch.testing in fresh ranks."""
    ok = torch.equal(a, b) if exact else a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-8)
    assert ok, f"max |a - b| = {(a - b).abs().max() if a.shape == b.shape else (a.shape, b.shape)}"


def batches(world: int, case: str) -> list[torch.Tensor]:
    """Every rank's ids for one case (each rank builds all of them, so each can compute the reference)."""
    gen = torch.Generator().manual_seed(100 * world + ("random", "one_owner", "all_empty").index(case))
    if case == "random":  # duplicates, uneven sizes, rank 1 empty
        sizes = [11, 0, 23, 4][:world] if world > 1 else [17]
        return [torch.randint(0, NUM_ROWS, (n,), generator=gen) for n in sizes]
    if case == "one_owner":  # every id lives on rank world - 1
        return [
            torch.arange(world - 1, NUM_ROWS, world)[torch.randint(0, 3, (5 + r,), generator=gen)] for r in range(world)
        ]
    if case == "all_empty":
        return [torch.empty(0, dtype=torch.int64) for _ in range(world)]
    raise ValueError(case)


def upstream(ids: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(len(i), DIM, generator=gen) for i in ids]


def dense_adagrad(table: torch.Tensor, acc: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Adagrad on every element of the full table (torch.optim.Adagrad's formula; checked against it below)."""
    acc = acc + grad * grad
    return table - LR * grad / (acc.sqrt() + 1e-10), acc


def check_rank(rank: int, world: int) -> None:
    """All lookup, gradient, optimizer and gather checks for one rank (run inside a spawn, or in-process)."""
    assert world_and_rank() == (world, rank)
    ref = init_rows(NUM_ROWS, DIM, 1, 0, std=0.01, seed=SEED)
    timer = CommTimer()
    emb = ShardedEmbedding(NUM_ROWS, DIM, seed=SEED, timer=timer)
    assert torch.equal(emb.weight.detach(), ref[rank::world])
    assert emb.num_local == local_row_count(NUM_ROWS, world, rank)
    assert torch.equal(emb.global_ids(), torch.arange(rank, NUM_ROWS, world))
    ref_sum = torch.zeros(NUM_ROWS, DIM)
    for step, case in enumerate(("random", "one_owner", "all_empty")):
        ids = batches(world, case)
        ups = upstream(ids, step)
        out = emb.lookup(ids[rank])
        close(out, ref[ids[rank]], exact=True)
        # a second lookup in the same step accumulates on top of the first
        out2 = emb.lookup(ids[rank].flip(0))
        (out * ups[rank]).sum().add((out2 * ups[rank].flip(0)).sum()).backward()
        ref_grad = torch.zeros(NUM_ROWS, DIM)
        for i, u in zip(ids, ups, strict=True):
            ref_grad.index_add_(0, i, 2 * u)
        grad = emb.weight.grad if emb.weight.grad is not None else torch.zeros_like(emb.weight)
        close(grad, ref_grad[rank::world])
        moved = emb.step(LR)
        assert moved == int(ref_grad[rank::world].ne(0).any(1).sum())
        ref, ref_sum = dense_adagrad(ref, ref_sum, ref_grad)
        emb.zero_grad()
        close(emb.weight.detach(), ref[rank::world])
    full = emb.full_table()
    close(full, ref)
    close(emb.full_adagrad_sum(), ref_sum)
    emb.load_full_table(full * 2, ref_sum * 3)
    close(emb.weight.detach(), 2 * full[rank::world], exact=True)
    close(emb.adagrad_sum, 3 * ref_sum[rank::world], exact=True)
    if world > 1:
        assert timer.calls["all_to_all"] == 3 * 2 * 3  # counts, ids, vectors x 2 lookups x 3 steps
        assert timer.calls["all_to_all_grad"] == 2 * 3 and timer.calls["all_gather"] == 2
    else:
        assert timer.calls == {}
    check_all_reduce(rank, world)
    check_tiny_table(rank, world)
    check_planned_lookup(rank, world)


def check_planned_lookup(rank: int, world: int) -> None:
    """With every rank's ids known (``peer_ids``), the lookup skips the count and id exchanges: same vectors,
    same gradients, one all-to-all forward instead of three."""
    planned_timer, plain_timer = CommTimer(), CommTimer()
    planned = ShardedEmbedding(NUM_ROWS, DIM, seed=SEED, timer=planned_timer)
    plain = ShardedEmbedding(NUM_ROWS, DIM, seed=SEED, timer=plain_timer)
    for step, case in enumerate(("random", "one_owner", "all_empty")):
        ids = batches(world, case)
        ups = upstream(ids, 10 + step)
        a = planned.lookup(ids[rank], peer_ids=ids)
        b = plain.lookup(ids[rank])
        close(a, b, exact=True)
        (a * ups[rank]).sum().backward()
        (b * ups[rank]).sum().backward()
        ga = planned.weight.grad if planned.weight.grad is not None else torch.zeros_like(planned.weight)
        gb = plain.weight.grad if plain.weight.grad is not None else torch.zeros_like(plain.weight)
        close(ga, gb, exact=True)
        planned.zero_grad()
        plain.zero_grad()
    if world > 1:
        assert planned_timer.calls["all_to_all"] == 3 and plain_timer.calls["all_to_all"] == 9


def check_all_reduce(rank: int, world: int) -> None:
    timer = CommTimer()
    a, b = torch.full((2, 3), float(rank + 1)), torch.arange(4.0) * (rank + 1)
    all_reduce_sum_([a, b], timer=timer)
    total = sum(range(1, world + 1))
    assert torch.equal(a, torch.full((2, 3), float(total))) and torch.equal(b, torch.arange(4.0) * total)
    assert timer.calls.get("all_reduce", 0) == (1 if world > 1 else 0)


def check_tiny_table(rank: int, world: int) -> None:
    """A table with fewer rows than ranks: some shards are empty and must still take part."""
    emb = ShardedEmbedding(2, 3, seed=1)
    ids = torch.tensor([1, 1, 0]) if rank == 0 else torch.tensor([0])
    out = emb.lookup(ids)
    close(out, init_rows(2, 3, 1, 0, std=0.01, seed=1)[ids], exact=True)
    out.sum().backward()
    emb.step(0.5)
    assert emb.full_table().shape == (2, 3)


def test_init_is_identical_for_every_world_size() -> None:
    num_rows = 2 * INIT_CHUNK_ROWS + 7
    full = init_rows(num_rows, 3, 1, 0, std=0.5, seed=11)
    for world in (2, 3, 4):
        for rank in range(world):
            assert torch.equal(init_rows(num_rows, 3, world, rank, std=0.5, seed=11), full[rank::world])
    assert not torch.equal(full, init_rows(num_rows, 3, 1, 0, std=0.5, seed=12))


def test_one_rank_without_process_group() -> None:
    check_rank(0, 1)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_sharded_matches_unsharded(world: int, tmp_path) -> None:
    run_ranks(world, check_rank, tmp_path)


def test_adagrad_equals_torch_optim() -> None:
    emb = ShardedEmbedding(NUM_ROWS, DIM, seed=SEED)
    table = emb.weight.detach().clone().requires_grad_(True)
    opt = torch.optim.Adagrad([table], lr=LR, eps=1e-10)
    acc = torch.zeros(NUM_ROWS, DIM)
    ref = table.detach().clone()
    for step in range(3):
        ids = torch.randint(0, NUM_ROWS, (9,), generator=torch.Generator().manual_seed(step))
        emb.zero_grad()
        (emb.lookup(ids) * (step + 1)).sum().backward()
        table.grad = emb.weight.grad.clone()
        emb.step(LR)
        opt.step()
        ref, acc = dense_adagrad(ref, acc, table.grad)
        close(emb.weight.detach(), table.detach(), exact=True)
        close(emb.adagrad_sum, opt.state[table]["sum"], exact=True)
        close(ref, table.detach())


def test_bad_ids() -> None:
    emb = ShardedEmbedding(10, 2)
    with pytest.raises(MetaError, match=r"id 10 is outside the table's 10 rows.*meta\.json"):
        emb.lookup(torch.tensor([3, 10]))
    with pytest.raises(MetaError, match="id -1"):
        emb.lookup(torch.tensor([-1]))
    with pytest.raises(ValueError, match="1-D integer"):
        emb.lookup(torch.tensor([[1]]))
    with pytest.raises(MetaError, match="num_rows"):
        ShardedEmbedding(0, 2)
    with pytest.raises(MetaError, match=r"shape \(3, 2\).*10 x 2"):
        emb.load_full_table(torch.zeros(3, 2))
    assert emb.step(0.1) == 0  # no grad yet: nothing to do
