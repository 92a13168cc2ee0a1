"""The dense part of the recommendation models: DLRM (bottom MLP, pairwise dot interaction, top MLP) and MeLU.

Embedding tables live outside these modules (:mod:`gpufleet.meta.embedding` shards them across ranks), so a
model takes already looked-up vectors ``emb [..., F, d]`` and dense features ``dense [..., D]`` and returns one
logit per sample. Only these dense parameters are replicated, adapted in MAML's inner loop and all-reduced.

Which parameters the inner loop adapts is explicit (``ModelConfig.adapt``, see :func:`adapted_names`): every
layer (``all``), the decision layers only as MeLU does (``decision``: DLRM's top MLP, MeLU's decision MLP; the
embeddings and DLRM's bottom MLP stay shared), or the last layer only (``last``). Two optional meta-parameters are
shared, never adapted: Meta-SGD's per-parameter inner rates (``learned_rates``, one rate per adapted weight) and a
task memory (``memory`` > 0, as in TaNP / MAMO): an encoder that reads the support set (features and labels) into
one task vector, which joins the model's input (DLRM: one more vector in the pairwise interaction).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from gpufleet.errors import MetaError

MODEL_KINDS = ("dlrm", "melu")
ADAPT_CHOICES = ("all", "decision", "last")
RATE_PREFIX = "inner_rates."
MEMORY_PREFIX = "memory."


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a model: kind, feature counts (from the prepared tasks) and layer sizes (from flags)."""

    kind: str = "dlrm"
    num_sparse: int = 1
    num_dense: int = 0
    emb_dim: int = 16
    bottom: tuple[int, ...] = (64,)
    top: tuple[int, ...] = (64, 32)
    adapt: str = "all"
    learned_rates: bool = False
    rate_init: float = 0.1
    memory: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.adapt not in ADAPT_CHOICES:
            raise MetaError(f"--adapt {self.adapt!r}: choose one of {', '.join(ADAPT_CHOICES)}")
        if self.memory < 0:
            raise MetaError(f"--memory {self.memory}: the task memory's width must be >= 0 (0 = no memory)")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelConfig:
        data = dict(data)
        data["bottom"] = tuple(data.get("bottom", ()))
        data["top"] = tuple(data.get("top", ()))
        return cls(**data)


def mlp(sizes: list[int], final_activation: bool) -> nn.Sequential:
    """Linear layers with ReLU between them (and after the last one when ``final_activation``)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or final_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def apply_mlp(seq: nn.Sequential, prefix: str, params: dict[str, torch.Tensor] | None, x: torch.Tensor) -> torch.Tensor:
    """Run ``seq`` on ``x``; with ``params`` its linear layers use ``params[f"{prefix}.{i}.weight"]``: per-task
    weights [T, out, in] on inputs [T, ..., in] (one batched matmul per layer for all tasks), or shared [out, in]."""
    if params is None:
        return seq(x)
    for i, layer in enumerate(seq):
        if isinstance(layer, nn.Linear):
            weight, bias = params[f"{prefix}.{i}.weight"], params[f"{prefix}.{i}.bias"]
            if weight.dim() == 2:
                x = torch.nn.functional.linear(x, weight, bias)
                continue
            flat = x.reshape(x.shape[0], -1, x.shape[-1])
            x = torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2)).reshape(*x.shape[:-1], -1)
        else:
            x = layer(x)
    return x


class DLRMDense(nn.Module):
    """DLRM: dense features through a bottom MLP to the embedding width, dot products of every pair of vectors
    (embeddings and the bottom output), concatenated with the bottom output, then a top MLP to one logit."""

    decision = "top"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, f = config.emb_dim, config.num_sparse
        self.has_dense = config.num_dense > 0
        self.bottom = mlp([config.num_dense, *config.bottom, d], final_activation=True) if self.has_dense else None
        self.has_memory = config.memory > 0
        vectors = f + int(self.has_dense) + int(self.has_memory)
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        interactions = rows.numel() + (d if self.has_dense else f * d) + (d if self.has_memory else 0)
        self.top = mlp([interactions, *config.top, 1], final_activation=False)

    def forward(self, emb: torch.Tensor, dense: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_with(None, emb, dense, task)

    def forward_with(
        self,
        params: dict[str, torch.Tensor] | None,
        emb: torch.Tensor,
        dense: torch.Tensor,
        task: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Forward with the module's parameters (``params`` None) or per-task ones ([T, ...], inputs [T, ...]);
        ``task`` is the task memory's vector ([T, d], or [d] for one task), required when the model has one."""
        if self.bottom is not None:
            x = apply_mlp(self.bottom, "bottom", params, dense)
            vectors = torch.cat([x.unsqueeze(-2), emb], dim=-2)
            first = x
        else:
            vectors = emb
            first = emb.flatten(-2)
        if self.has_memory:
            per_sample = _broadcast_task(task, emb)
            vectors = torch.cat([vectors, per_sample.unsqueeze(-2)], dim=-2)
            first = torch.cat([first, per_sample], dim=-1)
        gram = vectors @ vectors.transpose(-1, -2)
        pairs = gram[..., self.pair_rows, self.pair_cols]
        return apply_mlp(self.top, "top", params, torch.cat([first, pairs], dim=-1)).squeeze(-1)


def _broadcast_task(task: torch.Tensor | None, emb: torch.Tensor) -> torch.Tensor:
    """The task vector ([T, d] or [d]) repeated for every sample of ``emb`` ([T, S, F, d] or [S, F, d])."""
    if task is None:
        raise MetaError("this model has a task memory: score it through the MAML functions, which encode the support")
    shape = (*emb.shape[:-2], emb.shape[-1])
    return task.reshape(*task.shape[:-1], *([1] * (len(shape) - task.dim())), task.shape[-1]).expand(shape)


class MeLUDense(nn.Module):
    """MeLU (Lee et al., KDD 2019): embeddings and dense features concatenated, then a decision MLP."""

    decision = "decide"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.has_memory = config.memory > 0
        width = config.num_sparse * config.emb_dim + config.num_dense + (config.emb_dim if self.has_memory else 0)
        self.decide = mlp([width, *config.top, 1], final_activation=False)

    def forward(self, emb: torch.Tensor, dense: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_with(None, emb, dense, task)

    def forward_with(
        self,
        params: dict[str, torch.Tensor] | None,
        emb: torch.Tensor,
        dense: torch.Tensor,
        task: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Forward with the module's parameters (``params`` None) or per-task ones ([T, ...], inputs [T, ...])."""
        parts = [emb.flatten(-2), dense]
        if self.has_memory:
            parts.append(_broadcast_task(task, emb))
        return apply_mlp(self.decide, "decide", params, torch.cat(parts, dim=-1)).squeeze(-1)


class TaskMemory(nn.Module):
    """TaNP / MAMO-style task memory: each support sample (embeddings, the same signed by the label, dense
    features, label) through a small MLP, averaged over the task's real samples, projected to one task vector of
    the embedding width. The signed copy lets a mean over the set hold "liked minus disliked" directly."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        width = 2 * config.num_sparse * config.emb_dim + config.num_dense + 1
        self.read = nn.Linear(width, config.memory)
        self.write = nn.Linear(config.memory, config.emb_dim)

    def forward(self, emb: torch.Tensor, dense: torch.Tensor, label: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Support set ([T, S, ...] or [S, ...]) -> task vectors [T, d] (or [d]); an empty set gives write's bias."""
        signed = (2.0 * label - 1.0).unsqueeze(-1)
        flat = emb.flatten(-2)
        hidden = torch.relu(self.read(torch.cat([flat, signed * flat, dense, signed], dim=-1)))
        weight = mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weight).sum(-2) / weight.sum(-2).clamp_min(1.0)
        return self.write(pooled)


def _add_meta_parameters(model: nn.Module, config: ModelConfig) -> None:
    """The shared meta-parameters: the task memory, and one learned inner rate per adapted weight (Meta-SGD)."""
    if config.memory > 0:
        model.memory = TaskMemory(config)
    model.adapted = adapted_names(model, config.adapt)
    if config.learned_rates:
        named = dict(model.named_parameters())
        model.inner_rates = nn.ParameterDict(
            {_rate_key(n): nn.Parameter(torch.full_like(named[n].detach(), config.rate_init)) for n in model.adapted}
        )


def _rate_key(name: str) -> str:
    return name.replace(".", "__")


def rate_name(name: str) -> str:
    """The parameter name of the learned inner rate of adapted parameter ``name``."""
    return RATE_PREFIX + _rate_key(name)


def adapted_names(model: nn.Module, adapt: str) -> tuple[str, ...]:
    """The parameters the inner loop adapts; every other parameter is shared (updated by the outer loop only).

    ``all``: every layer of the network (never the memory or the rates); ``decision``: the decision MLP (DLRM's
    top, MeLU's decide), as MeLU's local update; ``last``: the decision MLP's last linear layer.
    """
    names = [n for n, _ in model.named_parameters() if not n.startswith((RATE_PREFIX, MEMORY_PREFIX))]
    if adapt == "all":
        return tuple(names)
    head = [n for n in names if n.startswith(model.decision + ".")]
    if adapt == "decision":
        return tuple(head)
    last = max(int(n.split(".")[1]) for n in head)
    return tuple(n for n in head if int(n.split(".")[1]) == last)


def build_model(config: ModelConfig, seed: int = 0) -> nn.Module:
    """The dense model of ``config.kind``, initialised from ``seed`` (identical on every rank)."""
    if config.kind not in MODEL_KINDS:
        raise MetaError(f"--model {config.kind!r}: unknown model; choose one of {', '.join(MODEL_KINDS)}")
    if config.num_sparse < 1:
        raise MetaError("the prepared tasks have no sparse feature; a recommendation model needs at least the item")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DLRMDense(config) if config.kind == "dlrm" else MeLUDense(config)
        _add_meta_parameters(model, config)
        return model
