"""The shape of a Llama-architecture model, read from a Hugging Face ``config.json`` (or built for tests).

Only what the forward pass needs: sizes, heads (grouped-query attention), RMSNorm epsilon, RoPE base (and
Llama 3's frequency scaling), tied embeddings. Unknown or unsupported settings fail with a message naming them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import ServeError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of a Llama model (Hugging Face field names, so a config.json maps one to one)."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def eos_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        return tuple(self.eos_token_id) if isinstance(self.eos_token_id, list) else (self.eos_token_id,)

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each of a layer's seven projections, by Hugging Face module name."""
        h, inter = self.hidden_size, self.intermediate_size
        q_out, kv_out = self.num_attention_heads * self.head_size, self.num_key_value_heads * self.head_size
        return {
            "q_proj": (h, q_out),
            "k_proj": (h, kv_out),
            "v_proj": (h, kv_out),
            "o_proj": (q_out, h),
            "gate_proj": (h, inter),
            "up_proj": (h, inter),
            "down_proj": (inter, h),
        }

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V that one token occupies over all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_size * dtype_bytes

    def to_hf(self) -> dict[str, Any]:
        """A Hugging Face config.json for this shape (LlamaForCausalLM)."""
        data = {k: v for k, v in asdict(self).items() if k != "extra" and v is not None}
        data.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu")
        return data

    @classmethod
    def from_hf(cls, data: dict[str, Any], source: str = "config.json") -> LlamaConfig:
        """Read a Hugging Face config dict; reject architectures and options the forward pass does not implement."""
        arch = (data.get("architectures") or ["LlamaForCausalLM"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ServeError(
                f"{source}: architecture {arch!r} is not supported; gpufleet serve runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if data.get("hidden_act", "silu") != "silu":
            raise ServeError(f"{source}: hidden_act {data['hidden_act']!r} is not supported (Llama uses silu)")
        rope = data.get("rope_scaling") or data.get("rope_parameters")
        theta = data.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0
        if rope is not None:
            kind = rope.get("rope_type", rope.get("type", "default"))
            if kind not in ("default", "llama3"):
                raise ServeError(f"{source}: rope scaling {kind!r} is not supported (default and llama3 are)")
            rope = None if kind == "default" else dict(rope)
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        kwargs = {k: data[k] for k in known if k in data and k not in ("rope_theta", "rope_scaling")}
        kwargs.setdefault("num_key_value_heads", data.get("num_attention_heads", 32))
        missing = [
            k
            for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
            if k not in data
        ]
        if missing:
            raise ServeError(f"{source}: missing {', '.join(missing)}; is this a Llama config.json?")
        return cls(
            **kwargs,
            rope_theta=float(theta),
            rope_scaling=rope,
            extra={k: v for k, v in data.items() if k not in known},
        )

    @classmethod
    def load(cls, folder: str | Path) -> LlamaConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ServeError(
                f"{folder}: no config.json; --base must be a Hugging Face model folder (config.json + *.safetensors)"
            )
        try:
            return cls.from_hf(json.loads(path.read_text()), str(path))
        except json.JSONDecodeError as exc:
            raise ServeError(f"{path}: not valid JSON ({exc})") from None


TINY_LLAMA = LlamaConfig(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=172,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    bos_token_id=256,
    eos_token_id=257,
)
"""A tiny random Llama for tests: byte-level vocabulary (256 bytes + BOS/EOS + spare ids), GQA 4:2."""

SMALL_LLAMA = LlamaConfig(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1376,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=4096,
    bos_token_id=256,
    eos_token_id=257,
)
"""A small random Llama for CPU benchmarks (about 55 M parameters, Llama-2 vocabulary size)."""

WIDE_LLAMA = LlamaConfig(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5504,
    num_hidden_layers=2,
    num_attention_heads=16,
    num_key_value_heads=8,
    max_position_embeddings=4096,
    bos_token_id=256,
    eos_token_id=257,
)
"""Two layers of a 1B-class Llama (hidden 2048, Llama-2 vocabulary): rank-16 adapters weigh against the base
weights as in real models (the ratio that decides LoRA's cost), at a depth a CPU benchmark can afford."""

LLAMA_7B = LlamaConfig(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    max_position_embeddings=4096,
    bos_token_id=256,
    eos_token_id=257,
)
"""Llama-2-7B's shape (Punica's own benchmark model), random: for the GPU bench; 13 GiB in fp16."""

NAMED_RANDOM_MODELS = {
    "tiny-llama-random": TINY_LLAMA,
    "small-llama-random": SMALL_LLAMA,
    "wide-llama-random": WIDE_LLAMA,
    "llama-7b-random": LLAMA_7B,
}
