"""The dense part of the recommendation models: DLRM (bottom MLP, pairwise dot interaction, top MLP) and MeLU.

Embedding tables live outside these modules (:mod:`gpufleet.meta.embedding` shards them across ranks), so a
model takes already looked-up vectors ``emb [..., F, d]`` and dense features ``dense [..., D]`` and returns one
logit per sample. Only these dense parameters are replicated, adapted in MAML's inner loop and all-reduced.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from gpufleet.errors import MetaError

MODEL_KINDS = ("dlrm", "melu")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a model: kind, feature counts (from the prepared tasks) and layer sizes (from flags)."""

    kind: str = "dlrm"
    num_sparse: int = 1
    num_dense: int = 0
    emb_dim: int = 16
    bottom: tuple[int, ...] = (64,)
    top: tuple[int, ...] = (64, 32)
    extra: dict[str, Any] = field(default_factory=dict)

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
    """Run ``seq`` on ``x``; with ``params`` its linear layers use per-task weights ``params[f"{prefix}.{i}.weight"]``
    of shape [T, out, in] on inputs [T, ..., in] (one batched matmul per layer for all tasks)."""
    if params is None:
        return seq(x)
    for i, layer in enumerate(seq):
        if isinstance(layer, nn.Linear):
            weight, bias = params[f"{prefix}.{i}.weight"], params[f"{prefix}.{i}.bias"]
            flat = x.reshape(x.shape[0], -1, x.shape[-1])
            x = torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2)).reshape(*x.shape[:-1], -1)
        else:
            x = layer(x)
    return x


class DLRMDense(nn.Module):
    """DLRM: dense features through a bottom MLP to the embedding width, dot products of every pair of vectors
    (embeddings and the bottom output), concatenated with the bottom output, then a top MLP to one logit."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, f = config.emb_dim, config.num_sparse
        self.has_dense = config.num_dense > 0
        self.bottom = mlp([config.num_dense, *config.bottom, d], final_activation=True) if self.has_dense else None
        vectors = f + int(self.has_dense)
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        interactions = rows.numel() + (d if self.has_dense else f * d)
        self.top = mlp([interactions, *config.top, 1], final_activation=False)

    def forward(self, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.forward_with(None, emb, dense)

    def forward_with(
        self, params: dict[str, torch.Tensor] | None, emb: torch.Tensor, dense: torch.Tensor
    ) -> torch.Tensor:
        """Forward with the module's parameters (``params`` None) or per-task ones ([T, ...], inputs [T, ...])."""
        if self.bottom is not None:
            x = apply_mlp(self.bottom, "bottom", params, dense)
            vectors = torch.cat([x.unsqueeze(-2), emb], dim=-2)
            first = x
        else:
            vectors = emb
            first = emb.flatten(-2)
        gram = vectors @ vectors.transpose(-1, -2)
        pairs = gram[..., self.pair_rows, self.pair_cols]
        return apply_mlp(self.top, "top", params, torch.cat([first, pairs], dim=-1)).squeeze(-1)


class MeLUDense(nn.Module):
    """MeLU (Lee et al., KDD 2019): embeddings and dense features concatenated, then a decision MLP."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        width = config.num_sparse * config.emb_dim + config.num_dense
        self.decide = mlp([width, *config.top, 1], final_activation=False)

    def forward(self, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.forward_with(None, emb, dense)

    def forward_with(
        self, params: dict[str, torch.Tensor] | None, emb: torch.Tensor, dense: torch.Tensor
    ) -> torch.Tensor:
        """Forward with the module's parameters (``params`` None) or per-task ones ([T, ...], inputs [T, ...])."""
        return apply_mlp(self.decide, "decide", params, torch.cat([emb.flatten(-2), dense], dim=-1)).squeeze(-1)


def build_model(config: ModelConfig, seed: int = 0) -> nn.Module:
    """The dense model of ``config.kind``, initialised from ``seed`` (identical on every rank)."""
    if config.kind not in MODEL_KINDS:
        raise MetaError(f"--model {config.kind!r}: unknown model; choose one of {', '.join(MODEL_KINDS)}")
    if config.num_sparse < 1:
        raise MetaError("the prepared tasks have no sparse feature; a recommendation model needs at least the item")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DLRMDense(config) if config.kind == "dlrm" else MeLUDense(config)
