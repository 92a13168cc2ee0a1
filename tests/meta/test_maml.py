"""MAML: the vmapped batch equals a per-task loop, second order matches finite differences, first order does not."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpufleet.errors import MetaError  # noqa: E402
from gpufleet.meta.dense import ModelConfig, build_model  # noqa: E402
from gpufleet.meta.maml import (  # noqa: E402
    MamlConfig,
    adapted_logits,
    dense_params,
    task_loss,
    task_losses,
    task_losses_vmap,
)

T, S, Q, F, D, U, DIM = 5, 6, 7, 4, 3, 30, 8


def _problem(kind: str = "dlrm", num_dense: int = D):
    gen = torch.Generator().manual_seed(0)
    model = build_model(
        ModelConfig(kind=kind, num_sparse=F, num_dense=num_dense, emb_dim=DIM, bottom=(16,), top=(16, 8))
    ).double()
    table = torch.randn(U, DIM, dtype=torch.double, generator=gen, requires_grad=True)

    def sets(n):
        idx = torch.randint(0, U, (T, n, F), generator=gen)
        dense = torch.randn(T, n, num_dense, dtype=torch.double, generator=gen)
        label = (torch.rand(T, n, generator=gen) > 0.5).double()
        mask = torch.rand(T, n, generator=gen) > 0.2
        return idx, dense, label, mask

    return model, table, sets(S), sets(Q)


@pytest.mark.parametrize("order", ["first", "second", "none"])
@pytest.mark.parametrize("adapt_embeddings", [False, True])
@pytest.mark.parametrize("kind", ["dlrm", "melu"])
def test_batched_tasks_equal_a_per_task_loop_and_vmap(order, adapt_embeddings, kind):
    model, table, sup, qry = _problem(kind)
    config = MamlConfig(order=order, inner_lr=0.3, inner_steps=2, adapt_embeddings=adapt_embeddings)
    params = dense_params(model)
    batched = task_losses(model, params, table, sup, qry, config)
    looped = torch.stack(
        [task_loss(model, params, table, tuple(x[t] for x in sup), tuple(x[t] for x in qry), config) for t in range(T)]
    )
    vmapped = task_losses_vmap(model, params, table, sup, qry, config)
    assert torch.allclose(batched, looped, atol=1e-12) and torch.allclose(vmapped, looped, atol=1e-12)
    g_looped = torch.autograd.grad(looped.sum(), [*params.values(), table])
    for other in (batched, vmapped):
        for a, b in zip(torch.autograd.grad(other.sum(), [*params.values(), table]), g_looped, strict=True):
            assert torch.allclose(a, b, atol=1e-12)


def _finite_difference(model, params, table, sup, qry, config, name, index, eps=1e-6):
    weight = params[name]
    with torch.no_grad():
        weight[index] += eps
        plus = task_losses(model, params, table, sup, qry, config).sum()
        weight[index] -= 2 * eps
        minus = task_losses(model, params, table, sup, qry, config).sum()
        weight[index] += eps
    return float((plus - minus) / (2 * eps))


@pytest.mark.parametrize("adapt_embeddings", [False, True])
def test_second_order_gradient_matches_finite_differences(adapt_embeddings):
    model, table, sup, qry = _problem()
    second = MamlConfig(order="second", inner_lr=0.5, inner_steps=2, adapt_embeddings=adapt_embeddings)
    first = MamlConfig(order="first", inner_lr=0.5, inner_steps=2, adapt_embeddings=adapt_embeddings)
    params = dense_params(model)
    g2 = dict(
        zip(
            params,
            torch.autograd.grad(task_losses(model, params, table, sup, qry, second).sum(), list(params.values())),
            strict=True,
        )
    )
    g1 = dict(
        zip(
            params,
            torch.autograd.grad(task_losses(model, params, table, sup, qry, first).sum(), list(params.values())),
            strict=True,
        )
    )
    checked = 0
    for name in params:
        for index in [(0,) * params[name].dim(), tuple(s - 1 for s in params[name].shape)]:
            fd = _finite_difference(model, params, table, sup, qry, second, name, index)
            assert g2[name][index].item() == pytest.approx(fd, rel=1e-5, abs=1e-8)
            checked += 1
    assert checked >= 8
    # first order drops the inner Hessian term, so it must differ somewhere
    assert max((g1[k] - g2[k]).abs().max().item() for k in params) > 1e-4


def test_adaptation_lowers_the_support_loss_and_changes_query_scores():
    model, table, sup, qry = _problem()
    params = dense_params(model)
    adapted = adapted_logits(model, params, table, sup, qry[0], qry[1], MamlConfig(inner_lr=0.5, inner_steps=3))
    plain = adapted_logits(model, params, table, sup, qry[0], qry[1], MamlConfig(order="none"))
    assert adapted.shape == (T, Q)
    assert not torch.allclose(adapted, plain)
    before = task_losses(model, params, table, sup, sup, MamlConfig(inner_steps=0))
    after = task_losses(model, params, table, sup, sup, MamlConfig(inner_lr=0.5, inner_steps=3))
    assert (after < before).all()


def test_bad_config_is_rejected():
    with pytest.raises(MetaError, match="--maml"):
        MamlConfig(order="third")
