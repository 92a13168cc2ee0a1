"""MAML: the vmapped batch equals a per-task loop, second order matches finite differences, first order does not."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpufleet.errors import MetaError  # noqa: E402
from gpufleet.meta.dense import (  # noqa: E402
    ModelConfig,
    build_model,
    rate_name,
)
from gpufleet.meta.maml import (  # noqa: E402
    MamlConfig,
    adapt_batched,
    adapted_logits,
    dense_params,
    task_loss,
    task_losses,
    task_losses_vmap,
)

T, S, Q, F, D, U, DIM = 5, 6, 7, 4, 3, 30, 8


def _problem(kind: str = "dlrm", num_dense: int = D, **variant):
    gen = torch.Generator().manual_seed(0)
    model = build_model(
        ModelConfig(kind=kind, num_sparse=F, num_dense=num_dense, emb_dim=DIM, bottom=(16,), top=(16, 8), **variant)
    ).double()
    with torch.no_grad():  # learned rates start equal; make them differ so that a mix-up of rates shows
        for rate in getattr(model, "inner_rates", {}).values():
            rate.uniform_(0.1, 0.6, generator=gen)
    table = torch.randn(U, DIM, dtype=torch.double, generator=gen, requires_grad=True)

    def sets(n):
        idx = torch.randint(0, U, (T, n, F), generator=gen)
        dense = torch.randn(T, n, num_dense, dtype=torch.double, generator=gen)
        label = (torch.rand(T, n, generator=gen) > 0.5).double()
        mask = torch.rand(T, n, generator=gen) > 0.2
        return idx, dense, label, mask

    return model, table, sets(S), sets(Q)


VARIANTS = {
    "all": {},
    "decision": {"adapt": "decision"},
    "meta-sgd": {"adapt": "last", "learned_rates": True},
    "memory": {"adapt": "decision", "memory": 6, "learned_rates": True},
}


# every order and embedding mode for the plain split; the variants (adapted split, rates, memory) with MAML only
CASES = [
    (order, emb, kind, variant)
    for order in ("first", "second", "none")
    for emb in (False, True)
    for kind in ("dlrm", "melu")
    for variant in VARIANTS
    if variant == "all" or (order != "none" and not emb)
]


@pytest.mark.parametrize(("order", "adapt_embeddings", "kind", "variant"), CASES)
def test_batched_tasks_equal_a_per_task_loop_and_vmap(order, adapt_embeddings, kind, variant):
    model, table, sup, qry = _problem(kind, **VARIANTS[variant])
    support_weight = 0.0 if adapt_embeddings else 0.5
    config = MamlConfig(
        order=order, inner_lr=0.3, inner_steps=2, adapt_embeddings=adapt_embeddings, support_weight=support_weight
    )
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


@pytest.mark.parametrize(("adapt_embeddings", "variant"), [(False, "all"), (True, "all"), (False, "memory")])
def test_second_order_gradient_matches_finite_differences(adapt_embeddings, variant):
    model, table, sup, qry = _problem(**VARIANTS[variant])
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
    names = [n for n in params if variant == "all" or n.startswith(("memory.", "inner_rates.", "top.4"))]
    for name in names:
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


def test_only_the_adapted_parameters_move_in_the_inner_loop():
    model, table, sup, _ = _problem(adapt="decision")
    assert model.adapted and all(n.startswith("top.") for n in model.adapted)
    assert any(n.startswith("bottom.") for n, _ in model.named_parameters())
    params = dense_params(model)
    fast, _, _ = adapt_batched(model, params, table, sup, MamlConfig(inner_lr=0.5, inner_steps=2))
    for name, value in params.items():
        if name in model.adapted:
            assert fast[name].shape == (T, *value.shape)
            assert not torch.allclose(fast[name], value.expand_as(fast[name]))
        else:
            assert fast[name] is value  # shared: the very tensor, not a per-task copy
    last = build_model(ModelConfig(num_sparse=F, num_dense=D, emb_dim=DIM, top=(16, 8), adapt="last"))
    assert last.adapted == ("top.4.weight", "top.4.bias")


def test_meta_sgd_steps_each_weight_by_its_own_learned_rate():
    model, table, sup, qry = _problem(adapt="last", learned_rates=True)
    params = dense_params(model)
    names = model.adapted
    with torch.no_grad():
        params[rate_name(names[0])].zero_()  # a zero rate freezes that weight in the inner loop
    fast, _, _ = adapt_batched(model, params, table, sup, MamlConfig(inner_lr=0.5, inner_steps=1))
    assert torch.equal(fast[names[0]], params[names[0]].expand_as(fast[names[0]]))
    assert not torch.allclose(fast[names[1]], params[names[1]].expand_as(fast[names[1]]))
    loss = task_losses(model, params, table, sup, qry, MamlConfig(inner_steps=1)).sum()
    grads = torch.autograd.grad(loss, [params[rate_name(n)] for n in names])
    assert all(g.abs().sum() > 0 for g in grads)  # first order still trains the rates


def test_task_memory_reads_the_support_labels():
    model, table, sup, qry = _problem(adapt="decision", memory=6)
    params = dense_params(model)
    config = MamlConfig(inner_steps=0)
    flipped = (sup[0], sup[1], 1.0 - sup[2], sup[3])
    before = adapted_logits(model, params, table, sup, qry[0], qry[1], config)
    after = adapted_logits(model, params, table, flipped, qry[0], qry[1], config)
    assert not torch.allclose(before, after)
    with pytest.raises(MetaError, match="task memory"):
        model(table[qry[0]], qry[1])
