"""The engine on a GPU (Triton's fused per-step LoRA kernel, SDPA without cuDNN, adapter loads through a pinned
buffer) generates what the CPU engine generates, with prompts and decodes of several adapters in the same steps
and more adapters than slots (evictions)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpufleet.serve.adapters import AdapterStore  # noqa: E402
from gpufleet.serve.bench import random_adapters  # noqa: E402
from gpufleet.serve.config import TINY_LLAMA  # noqa: E402
from gpufleet.serve.continuous_batching import Engine, EngineConfig  # noqa: E402
from gpufleet.serve.protocol import SamplingParams  # noqa: E402
from gpufleet.serve.weights import random_model  # noqa: E402


def _generate(model, device: str) -> dict[str, list[int]]:
    store = AdapterStore(TINY_LLAMA)
    names = [f"a{i}" for i in range(5)]
    for adapter in random_adapters(TINY_LLAMA, names, rank=8, seed=3):
        store.add(adapter)
    engine = Engine(model.to(device), store, EngineConfig(kv_blocks=64, adapter_slots=3, max_prefills_per_step=2))
    prompts = {f"r{i}": (list(range(3 + i, 9 + 2 * i)), names[i % 5] if i != 4 else None) for i in range(7)}
    for rid, (prompt, adapter) in prompts.items():
        engine.add_request(rid, prompt, adapter, SamplingParams(max_tokens=5, ignore_eos=True))
    out: dict[str, list[int]] = {rid: [] for rid in prompts}
    while engine.has_work():
        for chunk in engine.step():
            out[chunk.request_id].append(chunk.token_id)
    assert engine.adapters.evictions > 0
    return out


@pytest.mark.gpu
def test_gpu_engine_generates_what_the_cpu_engine_does():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("triton")
    reference = _generate(random_model(TINY_LLAMA, seed=4), "cpu")
    assert _generate(random_model(TINY_LLAMA, seed=4), "cuda") == reference
