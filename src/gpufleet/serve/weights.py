"""Base-model weights: load a Hugging Face folder (config.json + safetensors, sharded or not), or build a
random model of a named shape for tests and benchmarks (no weights can be downloaded here)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from gpufleet.errors import ServeError
from gpufleet.serve.config import NAMED_RANDOM_MODELS, LlamaConfig
from gpufleet.serve.lora_llama import LlamaLoRAForCausalLM


def _safetensor_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ServeError(
            f"{folder}: no *.safetensors weights; save the model with save_pretrained(..., safe_serialization=True)"
        )
    return files


def load_state(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files by name (memory-mapped)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in _safetensor_files(folder):
        if not path.is_file():
            raise ServeError(f"{path}: listed in the index but missing")
        state.update(load_file(str(path)))
    return state


def load_model(
    base: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0
) -> LlamaLoRAForCausalLM:
    """A model from a Hugging Face folder, or a random one when ``base`` names a shape (tiny-llama-random ...)."""
    if str(base) in NAMED_RANDOM_MODELS:
        config = NAMED_RANDOM_MODELS[str(base)]
        if torch.device(device).type == "cpu":
            return random_model(config, seed=seed).to(dtype=dtype)
        return random_model_on(config, device=device, dtype=dtype, seed=seed)
    folder = Path(base)
    if not folder.is_dir():
        raise ServeError(f"--base {base}: neither a model folder nor one of {', '.join(NAMED_RANDOM_MODELS)}")
    config = LlamaConfig.load(folder)
    with torch.device("meta"):
        model = LlamaLoRAForCausalLM(config)
    state = load_state(folder)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = set(model.state_dict())
    missing = sorted(expected - set(state))
    unexpected = sorted(k for k in set(state) - expected if not k.endswith("rotary_emb.inv_freq"))
    if missing:
        raise ServeError(f"{folder}: weights missing for {len(missing)} parameters, e.g. {missing[:3]}")
    if unexpected:
        raise ServeError(f"{folder}: {len(unexpected)} tensors this Llama does not have, e.g. {unexpected[:3]}")
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, assign=True)
    model.inv_freq = _fresh_inv_freq(config)  # a buffer: not in the file, was created on the meta device
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(dtype=dtype, device=device).eval()


def _fresh_inv_freq(config: LlamaConfig) -> torch.Tensor:
    from gpufleet.serve.lora_llama import rope_inverse_frequencies

    return rope_inverse_frequencies(config)


def random_model(config: LlamaConfig, seed: int = 0, std: float = 0.02) -> LlamaLoRAForCausalLM:
    """A Llama of ``config``'s shape with normal(0, std) weights and unit norms, the same for a seed."""
    gen = torch.Generator().manual_seed(seed)
    model = LlamaLoRAForCausalLM(config)
    _fill_random(model, lambda param: param.copy_(torch.randn(param.shape, generator=gen) * std))
    return model.eval()


def _fill_random(model: LlamaLoRAForCausalLM, draw: Callable[[torch.Tensor], object]) -> None:
    """Norm weights to 1, every other parameter through ``draw`` (in place, without autograd)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                draw(param)


def random_model_on(
    config: LlamaConfig, device: str, dtype: torch.dtype = torch.float16, seed: int = 0, std: float = 0.02
) -> LlamaLoRAForCausalLM:
    """A random Llama drawn on ``device`` itself: a 7B shape never passes through host memory in fp32.

    The same for a seed on one device kind, not the same numbers as :func:`random_model` on the CPU.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device):
        model = LlamaLoRAForCausalLM(config).to(dtype=dtype)
    _fill_random(model, lambda param: param.normal_(0.0, std, generator=gen))
    return model.eval()


def save_model(model: LlamaLoRAForCausalLM, folder: str | Path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (Hugging Face layout)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf(), indent=1))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"))
    return folder
