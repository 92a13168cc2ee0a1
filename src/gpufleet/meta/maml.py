"""MAML over the dense model: a functional inner loop per task on its support set, the outer loss on its query set.

The inner loop updates a copy of the model's adapted parameters (``model.adapted``; the shared ones, the task
memory and the learned rates are never adapted; no module state changes), each with its Meta-SGD rate when the
model learns them, and optionally a per-task delta on the looked-up embedding rows. ``order="first"`` cuts the
inner gradient out of the graph (FOMAML: d fast / d slow = I); ``order="second"`` keeps it, so the outer backward
differentiates through the inner update.
``task_losses`` runs all of a batch's tasks at once (padded sets and masks) with per-task weights [T, ...] and
batched matmuls; ``task_loss`` is the same computation for one task through ``torch.func.grad`` and
``functional_call`` (used by the naive baseline, and by the tests as an independent second path, also vmapped).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.functional import binary_cross_entropy_with_logits

from gpufleet.errors import MetaError
from gpufleet.meta.dense import MEMORY_PREFIX, rate_name

ORDERS = ("first", "second", "none")
Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class MamlConfig:
    """Meta-learning hyper-parameters. ``order="none"`` is the plain (non-meta) model: no inner loop."""

    order: str = "first"
    inner_lr: float = 0.1
    inner_steps: int = 1
    adapt_embeddings: bool = False
    support_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise MetaError(f"--maml {self.order!r}: choose first-order, second-order or none")
        if self.inner_steps < 0 or self.inner_lr < 0 or self.support_weight < 0:
            raise MetaError("--inner-steps, --inner-lr and --support-weight must not be negative")

    @property
    def adapts(self) -> bool:
        return self.order != "none" and self.inner_steps > 0 and self.inner_lr > 0


def masked_bce(logits: torch.Tensor, label: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy over the unmasked samples (0 when a set is empty)."""
    weight = mask.to(logits.dtype)
    per_sample = binary_cross_entropy_with_logits(logits, label, reduction="none")
    return (per_sample * weight).sum() / weight.sum().clamp_min(1.0)


def dense_params(model: nn.Module) -> Params:
    """The model's trainable parameters by name (the tensors the inner loop adapts)."""
    return {name: p for name, p in model.named_parameters()}


def _forward(
    model: nn.Module,
    params: Params,
    table: torch.Tensor,
    delta: torch.Tensor | None,
    idx: torch.Tensor,
    dense: torch.Tensor,
    task: torch.Tensor | None = None,
) -> torch.Tensor:
    rows = table if delta is None else table + delta
    return functional_call(model, params, (rows[idx], dense, task))


def _memory_params(params: Params) -> Params:
    return {k[len(MEMORY_PREFIX) :]: v for k, v in params.items() if k.startswith(MEMORY_PREFIX)}


def task_vector(
    model: nn.Module, params: Params, rows: torch.Tensor, sup: tuple[torch.Tensor, ...]
) -> torch.Tensor | None:
    """The task memory's vector of each task from its support set (None when the model has no memory).

    ``rows`` is the embedding table the support ids index ([U, d]); the memory reads the shared rows, before any
    per-task embedding delta, and its parameters are shared (never adapted).
    """
    if not getattr(model, "has_memory", False):
        return None
    idx, dense, label, mask = sup
    return functional_call(model.memory, _memory_params(params), (rows[idx], dense, label, mask))


def inner_rate(params: Params, name: str, config: MamlConfig) -> torch.Tensor | float:
    """The inner-loop step size of adapted parameter ``name``: its learned Meta-SGD rate, or ``inner_lr``."""
    return params.get(rate_name(name), config.inner_lr)


def adapt(
    model: nn.Module, params: Params, table: torch.Tensor, sup: tuple[torch.Tensor, ...], config: MamlConfig
) -> tuple[Params, torch.Tensor | None, torch.Tensor | None]:
    """Inner loop on one task's support set -> parameters with the adapted ones updated (shared ones as given),
    the embedding delta when enabled, and the task memory's vector when the model has one."""
    sup_idx, sup_dense, sup_label, sup_mask = sup
    fast = dict(params)
    delta = torch.zeros_like(table) if config.adapt_embeddings else None
    task = task_vector(model, params, table, sup)
    if not config.adapts:
        return fast, delta, task
    names = model.adapted

    def support_loss(adapted: Params, emb_delta: torch.Tensor | None) -> torch.Tensor:
        logits = _forward(model, {**fast, **adapted}, table, emb_delta, sup_idx, sup_dense, task)
        return masked_bce(logits, sup_label, sup_mask)

    argnums = (0, 1) if delta is not None else 0
    for _ in range(config.inner_steps):
        grads = grad(support_loss, argnums=argnums)({k: fast[k] for k in names}, delta)
        g_params, g_delta = grads if delta is not None else (grads, None)
        if config.order == "first":
            g_params = {k: v.detach() for k, v in g_params.items()}
            g_delta = g_delta.detach() if g_delta is not None else None
        fast.update({k: fast[k] - inner_rate(params, k, config) * g_params[k] for k in names})
        if delta is not None:
            delta = delta - config.inner_lr * g_delta
    return fast, delta, task


def task_loss(
    model: nn.Module,
    params: Params,
    table: torch.Tensor,
    sup: tuple[torch.Tensor, ...],
    qry: tuple[torch.Tensor, ...],
    config: MamlConfig,
) -> torch.Tensor:
    """One task's outer loss: adapt on the support set, then the loss on the query set.

    For the plain model (``order="none"``) the loss covers support and query alike, weighted by their sizes.
    """
    if config.order == "none":
        return _plain_loss(model, params, table, sup, qry)
    fast, delta, task = adapt(model, params, table, sup, config)
    q_idx, q_dense, q_label, q_mask = qry
    loss = masked_bce(_forward(model, fast, table, delta, q_idx, q_dense, task), q_label, q_mask)
    if config.support_weight > 0:
        s_idx, s_dense, s_label, s_mask = sup
        blind = None if task is None else torch.zeros_like(task)
        loss = loss + config.support_weight * masked_bce(
            _forward(model, params, table, None, s_idx, s_dense, blind), s_label, s_mask
        )
    return loss


def _plain_loss(
    model: nn.Module, params: Params, table: torch.Tensor, sup: tuple[torch.Tensor, ...], qry: tuple[torch.Tensor, ...]
) -> torch.Tensor:
    total = torch.zeros((), dtype=table.dtype)
    count = torch.zeros((), dtype=table.dtype)
    for idx, dense, label, mask in (sup, qry):
        weight = mask.to(table.dtype)
        logits = _forward(model, params, table, None, idx, dense)
        total = total + (binary_cross_entropy_with_logits(logits, label, reduction="none") * weight).sum()
        count = count + weight.sum()
    return total / count.clamp_min(1.0)


def _per_task_bce(logits: torch.Tensor, label: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean BCE of each task: logits/labels/mask [T, S] -> [T]."""
    weight = mask.to(logits.dtype)
    per_sample = binary_cross_entropy_with_logits(logits, label, reduction="none") * weight
    return per_sample.sum(dim=1) / weight.sum(dim=1).clamp_min(1.0)


def _gather_rows(table: torch.Tensor, delta: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor:
    """Embedding vectors [T, S, F, d] of index tensor [T, S, F], with each task's own delta when adapting rows."""
    if delta is None:
        return table[idx]
    rows = table.unsqueeze(0) + delta
    return rows[torch.arange(idx.shape[0]).view(-1, 1, 1), idx]


def _per_task_params(params: Params, names: tuple[str, ...], tasks: int) -> Params:
    """The adapted parameters repeated for every task ([T, ...]) as differentiable views of one tensor each; the
    shared ones as they are (a linear layer with 2-D weights is shared by every task)."""
    fast = dict(params)
    for name in names:
        value = params[name]
        if not value.requires_grad:  # evaluation of a frozen model: the inner loop still needs a graph
            value = value.detach().requires_grad_()
        fast[name] = value.unsqueeze(0).expand(tasks, *value.shape)
    return fast


def adapt_batched(
    model: nn.Module, params: Params, table: torch.Tensor, sup: tuple[torch.Tensor, ...], config: MamlConfig
) -> tuple[Params, torch.Tensor | None, torch.Tensor | None]:
    """Inner loops of all T tasks at once: per-task adapted weights [T, ...] and batched matmuls, plain autograd.

    Each task's support loss depends only on its own slice of the per-task weights, so one gradient of the
    summed loss is every task's own gradient; second order keeps that gradient's graph (``create_graph``).
    Returns the parameters (adapted ones per task), the embedding delta when enabled and the task vectors.
    """
    sup_idx, sup_dense, sup_label, sup_mask = sup
    tasks = sup_idx.shape[0]
    names = model.adapted
    with torch.enable_grad():
        fast = _per_task_params(params, names, tasks)
    task = task_vector(model, params, table, sup)
    delta = None
    if config.adapt_embeddings:
        delta = table.new_zeros((tasks, *table.shape), requires_grad=True)
    if not config.adapts:
        return fast, delta, task
    second = config.order == "second" and torch.is_grad_enabled()
    with torch.enable_grad():  # the inner loop needs gradients even when the caller scores under no_grad
        for _ in range(config.inner_steps):
            logits = model.forward_with(fast, _gather_rows(table, delta, sup_idx), sup_dense, task)
            loss = _per_task_bce(logits, sup_label, sup_mask).sum()
            inputs = [*(fast[k] for k in names), *([delta] if delta is not None else [])]
            grads = torch.autograd.grad(loss, inputs, create_graph=second)
            fast.update({k: fast[k] - inner_rate(params, k, config) * g for k, g in zip(names, grads, strict=False)})
            if delta is not None:
                delta = delta - config.inner_lr * grads[-1]
    return fast, delta, task


def task_losses(
    model: nn.Module,
    params: Params,
    table: torch.Tensor,
    sup: tuple[torch.Tensor, ...],
    qry: tuple[torch.Tensor, ...],
    config: MamlConfig,
) -> torch.Tensor:
    """Outer losses of all tasks of a batch at once -> tensor [T] (equal to ``task_loss`` per task).

    ``table`` holds the batch's deduplicated embedding rows [U, d], shared by every task; the sets' index
    tensors are [T, S, F] into it. All tasks run together: per-task weights and batched matmuls, no Python
    loop over tasks and no per-task autograd call.
    """
    if sup[0].shape[0] == 0:
        return table.new_zeros((0,))
    q_idx, q_dense, q_label, q_mask = qry
    if config.order == "none":
        total = table.new_zeros(sup[0].shape[0])
        count = table.new_zeros(sup[0].shape[0])
        for idx, dense, label, mask in (sup, qry):
            weight = mask.to(table.dtype)
            logits = functional_call(model, params, (table[idx], dense))
            total = total + (binary_cross_entropy_with_logits(logits, label, reduction="none") * weight).sum(1)
            count = count + weight.sum(1)
        return total / count.clamp_min(1.0)
    fast, delta, task = adapt_batched(model, params, table, sup, config)
    logits = model.forward_with(fast, _gather_rows(table, delta, q_idx), q_dense, task)
    losses = _per_task_bce(logits, q_label, q_mask)
    if config.support_weight > 0:
        s_idx, s_dense, s_label, s_mask = sup
        blind = None if task is None else torch.zeros_like(task)
        plain = model.forward_with(params, table[s_idx], s_dense, blind)
        losses = losses + config.support_weight * _per_task_bce(plain, s_label, s_mask)
    return losses


def task_losses_vmap(
    model: nn.Module,
    params: Params,
    table: torch.Tensor,
    sup: tuple[torch.Tensor, ...],
    qry: tuple[torch.Tensor, ...],
    config: MamlConfig,
) -> torch.Tensor:
    """The same as ``task_losses`` through ``torch.func.vmap`` of ``task_loss`` (a second, independent path)."""
    if sup[0].shape[0] == 0:
        return table.new_zeros((0,))

    def one(s_idx, s_dense, s_label, s_mask, q_idx, q_dense, q_label, q_mask):
        return task_loss(
            model, params, table, (s_idx, s_dense, s_label, s_mask), (q_idx, q_dense, q_label, q_mask), config
        )

    return vmap(one)(*sup, *qry)


def adapted_logits(
    model: nn.Module,
    params: Params,
    table: torch.Tensor,
    sup: tuple[torch.Tensor, ...],
    qry_idx: torch.Tensor,
    qry_dense: torch.Tensor,
    config: MamlConfig,
) -> torch.Tensor:
    """Query logits of every task after its inner loop on its support set -> [T, Q].

    This is k-shot adaptation at evaluation time; with ``order="none"`` the model scores without adapting.
    """
    if config.order == "none" or not (config.adapts or getattr(model, "has_memory", False)):
        return functional_call(model, params, (table[qry_idx], qry_dense)).detach()
    fast, delta, task = adapt_batched(model, params, table, sup, replace(config, order="first"))
    return model.forward_with(fast, _gather_rows(table, delta, qry_idx), qry_dense, task).detach()
