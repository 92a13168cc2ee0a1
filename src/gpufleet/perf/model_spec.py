"""Transformer model shapes: the ``ModelSpec`` the performance model reads, and the shipped catalog.

A model is a catalog name (``gpt3-175b``, ``llama3-405b``), a JSON/TOML file with the same fields, or
explicit shape flags; ``load_model`` merges them, explicit values winning, and validates the result.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufleet.errors import SpecError
from gpufleet.spec._toml import read_toml
from gpufleet.spec._validation import spec_error
from gpufleet.spec.catalog import Catalog, data_file, read_catalog

__all__ = ["ModelSpec", "get_model", "load_model", "model_catalog", "model_names"]


class ModelSpec(BaseModel):
    """A decoder-only transformer: the shape numbers that set its FLOPs, memory and communication."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="custom", min_length=1)
    aliases: tuple[str, ...] = ()
    layers: int = Field(gt=0, description="transformer blocks")
    hidden: int = Field(gt=0, description="model width h")
    heads: int = Field(gt=0, description="attention (query) heads")
    kv_heads: int | None = Field(default=None, gt=0, description="key/value heads (GQA); None = heads")
    ffn_hidden: int | None = Field(default=None, gt=0, description="MLP width; None = 4 x hidden")
    vocab: int = Field(gt=0, description="vocabulary size as trained (padded)")
    seq: int = Field(default=2048, gt=0, description="training sequence length")
    glu: bool = Field(default=False, description="gated MLP (SwiGLU): three weight matrices instead of two")
    bias: bool = Field(default=True, description="linear layers carry bias vectors")
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position: Literal["learned", "rope", "alibi"] = "learned"
    tied_embeddings: bool = Field(default=True, description="the output layer reuses the input embedding")
    dropout: bool = Field(default=True, description="trained with dropout (its masks are kept for the backward pass)")
    # --- mixture of experts (experts = 0: a dense model) ---
    experts: int = Field(default=0, ge=0, description="routed experts per MoE layer; 0 = dense MLP everywhere")
    top_k: int = Field(default=1, gt=0, description="routed experts each token visits")
    shared_experts: int = Field(default=0, ge=0, description="experts every token visits (DeepSeek, Llama 4)")
    expert_ffn: int | None = Field(default=None, gt=0, description="width of one expert's MLP; None = ffn_hidden")
    dense_layers: int = Field(default=0, ge=0, description="leading layers with a dense MLP (DeepSeek-V3: 3)")
    moe_every: int = Field(default=1, gt=0, description="after dense_layers, every n-th layer is MoE (Maverick: 2)")
    capacity_factor: float | None = Field(default=None, gt=0, description="token capacity per expert; None = dropless")
    route_nodes: int | None = Field(default=None, gt=0, description="node-limited routing: nodes a token may reach")
    mtp_depth: int = Field(
        default=0, ge=0, description="multi-token-prediction modules (DeepSeek-V3: 1), each a block and an output head"
    )
    # --- multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank None = standard attention ---
    q_lora_rank: int | None = Field(default=None, gt=0)
    kv_lora_rank: int | None = Field(default=None, gt=0)
    qk_nope_dim: int | None = Field(default=None, gt=0)
    qk_rope_dim: int | None = Field(default=None, gt=0)
    v_head_dim: int | None = Field(default=None, gt=0)
    source: str = ""

    @model_validator(mode="after")
    def _consistent_heads(self) -> ModelSpec:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.kv_heads is not None and (self.kv_heads > self.heads or self.heads % self.kv_heads):
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed experts ({self.experts})")
        if self.dense_layers > self.layers:
            raise ValueError(f"dense_layers ({self.dense_layers}) must not exceed layers ({self.layers})")
        mla = (self.kv_lora_rank, self.qk_nope_dim, self.qk_rope_dim, self.v_head_dim)
        if any(v is not None for v in mla) and any(v is None for v in mla):
            raise ValueError("latent attention needs kv_lora_rank, qk_nope_dim, qk_rope_dim and v_head_dim together")
        return self

    @property
    def is_moe(self) -> bool:
        """Whether some layers route tokens to experts."""
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        if not self.experts:
            return 0
        return len(range(self.dense_layers, self.layers, self.moe_every))

    @property
    def expert_width(self) -> int:
        """MLP width of one routed (or shared) expert."""
        return self.expert_ffn or self.ffn

    @property
    def is_mla(self) -> bool:
        """Whether attention is multi-head latent attention (compressed K/V)."""
        return self.kv_lora_rank is not None

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    @property
    def kv_heads_eff(self) -> int:
        """Key/value heads actually used (``heads`` for plain multi-head attention)."""
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        """MLP intermediate width."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def kv_width(self) -> int:
        """Width of the K (or V) projection: kv_heads x head_dim."""
        return self.kv_heads_eff * self.head_dim

    def with_overrides(self, **overrides: Any) -> ModelSpec:
        """A copy with the given non-None fields replaced (and re-validated)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if not given:
            return self
        data = self.model_dump()
        data.update(given)
        if "name" not in given and set(given) - {"seq"}:
            data["name"] = f"{self.name}*"
        data["aliases"] = ()
        return _validate(data, "model overrides")


def _validate(data: dict[str, Any], source: str) -> ModelSpec:
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error(exc, source, ModelSpec) from None


@functools.cache
def model_catalog() -> Catalog[ModelSpec]:
    """The shipped model catalog (``gpufleet/data/models.toml``), read on first use."""
    return read_catalog(data_file("models.toml"), ModelSpec, "models", what="model")


def model_names() -> list[str]:
    """Canonical names of the shipped models, sorted."""
    return model_catalog().names()


def get_model(name: str) -> ModelSpec:
    """A catalog model by name or alias; SpecError suggests the closest name."""
    return model_catalog().get(name)


def _read_model_file(path: Path) -> dict[str, Any]:
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SpecError(f"{path}: model file not found; check the path") from None
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); fix the syntax") from None
    else:
        data = read_toml(path, what="model file")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a model file holds one object of fields (layers, hidden, heads, ...)")
    return data


def load_model(model: str | Path | None = None, **overrides: Any) -> ModelSpec:
    """Resolve a model from a catalog name or a JSON/TOML file, then apply explicit shape overrides.

    With ``model=None`` the overrides must give the whole shape (layers, hidden, heads, vocab).
    """
    if model is None:
        given = {k: v for k, v in overrides.items() if v is not None}
        missing = [k for k in ("layers", "hidden", "heads", "vocab") if k not in given]
        if missing:
            raise SpecError(
                "no --model given and the shape is incomplete: missing "
                + ", ".join(f"--{k}" for k in missing)
                + f"; pass them or a catalog model ({', '.join(model_names()[:6])}, ...)"
            )
        return _validate(given, "model flags")
    path = Path(model)
    if path.suffix.lower() in {".json", ".toml"} or path.exists():
        base = _validate(_read_model_file(path), str(path))
    else:
        base = get_model(str(model))
    return base.with_overrides(**overrides)
