"""MAML over the dense model: a functional inner loop per task on its support set, the outer loss on its query set.

The inner loop updates a copy of the dense parameters with ``torch.func.grad`` (no module state changes), and
optionally a per-task delta on the looked-up embedding rows. ``order="first"`` cuts the inner gradient out of the
graph (FOMAML: d fast / d slow = I); ``order="second"`` keeps it, so the outer backward differentiates through
the inner update. ``task_losses`` runs all of a batch's tasks at once with ``torch.func.vmap`` (padded sets and
masks); ``task_loss`` is the same computation for one task, used by the naive baseline and to test the vmap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.functional import binary_cross_entropy_with_logits

from gpufleet.errors import MetaError

ORDERS = ("first", "second", "none")
Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class MamlConfig:
    """Meta-learning hyper-parameters. ``order="none"`` is the plain (non-meta) model: no inner loop."""

    order: str = "first"
    inner_lr: float = 0.1
    inner_steps: int = 1
    adapt_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise MetaError(f"--maml {self.order!r}: choose first-order, second-order or none")
        if self.inner_steps < 0 or self.inner_lr < 0:
            raise MetaError("--inner-steps and --inner-lr must not be negative")

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


def _forward(model: nn.Module, params: Params, table: torch.Tensor, delta: torch.Tensor | None,
             idx: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    rows = table if delta is None else table + delta
    return functional_call(model, params, (rows[idx], dense))


def adapt(model: nn.Module, params: Params, table: torch.Tensor, sup: tuple[torch.Tensor, ...],
          config: MamlConfig) -> tuple[Params, torch.Tensor | None]:
    """Inner loop on one task's support set -> adapted parameters (and embedding delta when enabled)."""
    sup_idx, sup_dense, sup_label, sup_mask = sup
    fast = params
    delta = torch.zeros_like(table) if config.adapt_embeddings else None
    if not config.adapts:
        return fast, delta

    def support_loss(fast_params: Params, emb_delta: torch.Tensor | None) -> torch.Tensor:
        logits = _forward(model, fast_params, table, emb_delta, sup_idx, sup_dense)
        return masked_bce(logits, sup_label, sup_mask)

    argnums = (0, 1) if delta is not None else 0
    for _ in range(config.inner_steps):
        grads = grad(support_loss, argnums=argnums)(fast, delta)
        g_params, g_delta = grads if delta is not None else (grads, None)
        if config.order == "first":
            g_params = {k: v.detach() for k, v in g_params.items()}
            g_delta = g_delta.detach() if g_delta is not None else None
        fast = {k: fast[k] - config.inner_lr * g_params[k] for k in fast}
        if delta is not None:
            delta = delta - config.inner_lr * g_delta
    return fast, delta


def task_loss(model: nn.Module, params: Params, table: torch.Tensor, sup: tuple[torch.Tensor, ...],
              qry: tuple[torch.Tensor, ...], config: MamlConfig) -> torch.Tensor:
    """One task's outer loss: adapt on the support set, then the loss on the query set.

    For the plain model (``order="none"``) the loss covers support and query alike, weighted by their sizes.
    """
    if config.order == "none":
        return _plain_loss(model, params, table, sup, qry)
    fast, delta = adapt(model, params, table, sup, config)
    q_idx, q_dense, q_label, q_mask = qry
    return masked_bce(_forward(model, fast, table, delta, q_idx, q_dense), q_label, q_mask)


def _plain_loss(model: nn.Module, params: Params, table: torch.Tensor, sup: tuple[torch.Tensor, ...],
                qry: tuple[torch.Tensor, ...]) -> torch.Tensor:
    total = torch.zeros((), dtype=table.dtype)
    count = torch.zeros((), dtype=table.dtype)
    for idx, dense, label, mask in (sup, qry):
        weight = mask.to(table.dtype)
        logits = _forward(model, params, table, None, idx, dense)
        total = total + (binary_cross_entropy_with_logits(logits, label, reduction="none") * weight).sum()
        count = count + weight.sum()
    return total / count.clamp_min(1.0)


def task_losses(model: nn.Module, params: Params, table: torch.Tensor, sup: tuple[torch.Tensor, ...],
                qry: tuple[torch.Tensor, ...], config: MamlConfig) -> torch.Tensor:
    """Outer losses of all tasks of a batch at once (vmap over the leading task axis) -> tensor [T].

    ``table`` holds the batch's deduplicated embedding rows [U, d], shared by every task; the sets' index
    tensors are [T, S, F] into it.
    """
    if sup[0].shape[0] == 0:
        return table.new_zeros((0,))

    def one(s_idx, s_dense, s_label, s_mask, q_idx, q_dense, q_label, q_mask):
        return task_loss(model, params, table, (s_idx, s_dense, s_label, s_mask),
                         (q_idx, q_dense, q_label, q_mask), config)

    return vmap(one)(*sup, *qry)


def adapted_logits(model: nn.Module, params: Params, table: torch.Tensor, sup: tuple[torch.Tensor, ...],
                   qry_idx: torch.Tensor, qry_dense: torch.Tensor, config: MamlConfig) -> torch.Tensor:
    """Query logits of every task after its inner loop on its support set (vmap over tasks) -> [T, Q].

    This is k-shot adaptation at evaluation time; with ``order="none"`` the model scores without adapting.
    """
    def one(s_idx, s_dense, s_label, s_mask, q_idx, q_dense):
        fast, delta = adapt(model, params, table, (s_idx, s_dense, s_label, s_mask), config)
        return _forward(model, fast, table, delta, q_idx, q_dense)

    logits: Callable[..., torch.Tensor] = vmap(one)
    return logits(*sup, qry_idx, qry_dense).detach()
