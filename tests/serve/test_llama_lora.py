"""The LoRA-aware Llama against Hugging Face transformers and PEFT (real library behaviour): a model saved by
``LlamaForCausalLM.save_pretrained`` loads and gives the same logits, and adapters written by PEFT itself give the
same outputs as PEFT, several different adapters in one batch."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from gpufleet.errors import ServeError  # noqa: E402
from gpufleet.serve.adapters import AdapterStore, load_peft_adapter  # noqa: E402
from gpufleet.serve.config import TINY_LLAMA  # noqa: E402
from gpufleet.serve.continuous_batching import Engine, EngineConfig  # noqa: E402
from gpufleet.serve.protocol import SamplingParams, UnknownAdapterError  # noqa: E402
from gpufleet.serve.weights import load_model, random_model, save_model  # noqa: E402

VOCAB = 300
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _hf_model(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=2,
        bos_token_id=1,
    )
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> tuple[Path, object]:
    folder = tmp_path_factory.mktemp("hf-llama")
    model = _hf_model()
    model.save_pretrained(folder)
    return folder, model


def _write_adapter(base, folder: Path, name: str, rank: int, targets: list[str], seed: int, rslora: bool = False):
    """A PEFT LoRA with random A and B (init_lora_weights=False), saved with PEFT's own save_pretrained."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False, use_rslora=rslora
    )
    wrapped = peft.get_peft_model(_hf_model(), config)
    wrapped.load_state_dict(base.state_dict(), strict=False)  # same base weights as the served model
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    wrapped.save_pretrained(folder / name)
    return wrapped.eval()


@pytest.fixture(scope="module")
def adapters(hf_folder, tmp_path_factory):
    _, base = hf_folder
    root = tmp_path_factory.mktemp("adapters")
    peft_models = {
        "all-r8": _write_adapter(base, root, "all-r8", 8, ALL, seed=1),
        "qv-r16": _write_adapter(base, root, "qv-r16", 16, ["q_proj", "v_proj"], seed=2),
        "mlp-r4-rs": _write_adapter(
            base, root, "mlp-r4-rs", 4, ["gate_proj", "up_proj", "down_proj"], seed=3, rslora=True
        ),
    }
    return root, peft_models


def _greedy_hf(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(ids).logits[0, -1].argmax())
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return ids[0, len(prompt) :].tolist()


def _run(engine: Engine, jobs: dict[str, tuple[list[int], str | None]], n: int) -> dict[str, list[int]]:
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    for rid, (prompt, adapter) in jobs.items():
        engine.add_request(rid, prompt, adapter, params)
    out: dict[str, list[int]] = {rid: [] for rid in jobs}
    while engine.has_work():
        for chunk in engine.step():
            out[chunk.request_id].append(chunk.token_id)
    return out


def test_base_model_matches_transformers(hf_folder):
    folder, hf = hf_folder
    engine = Engine(load_model(folder), AdapterStore(load_model(folder).config), EngineConfig(kv_blocks=64))
    prompts = {f"r{i}": ([(7 * i + j) % VOCAB for j in range(5 + 3 * i)], None) for i in range(4)}
    got = _run(engine, prompts, 12)
    for rid, (prompt, _) in prompts.items():
        assert got[rid] == _greedy_hf(hf, prompt, 12)


def test_peft_adapters_in_one_batch_match_peft(hf_folder, adapters):
    folder, hf = hf_folder
    root, peft_models = adapters
    model = load_model(folder)
    engine = Engine(model, AdapterStore(model.config, root), EngineConfig(kv_blocks=64, adapter_slots=4))
    jobs = {
        "a": ([5, 6, 7, 8, 9], "all-r8"),
        "b": ([11, 12, 13], "qv-r16"),
        "c": ([21, 22, 23, 24], "mlp-r4-rs"),
        "d": ([5, 6, 7, 8, 9], None),
        "e": ([30, 31], "all-r8"),
    }
    got = _run(engine, jobs, 10)
    for rid, (prompt, adapter) in jobs.items():
        reference = hf if adapter is None else peft_models[adapter]
        assert got[rid] == _greedy_hf(reference, prompt, 10), (rid, adapter)
    assert got["a"] != got["d"]  # the adapter changed the output


def test_adapter_slots_evict_least_recently_used(hf_folder, adapters):
    folder, _ = hf_folder
    root, peft_models = adapters
    model = load_model(folder)
    engine = Engine(model, AdapterStore(model.config, root), EngineConfig(kv_blocks=64, adapter_slots=2))
    first = _run(engine, {"x": ([1, 2, 3], "all-r8"), "y": ([1, 2, 3], "qv-r16")}, 4)
    again = _run(engine, {"z": ([1, 2, 3], "mlp-r4-rs")}, 4)  # needs a slot: evicts all-r8 (least recent)
    assert engine.adapters.evictions == 1 and "all-r8" not in engine.adapters.resident()
    back = _run(engine, {"w": ([1, 2, 3], "all-r8")}, 4)  # reloaded from CPU memory: same output
    assert back["w"] == first["x"] and again["z"] == _greedy_hf(peft_models["mlp-r4-rs"], [1, 2, 3], 4)


def test_three_adapters_with_two_slots_wait_for_a_free_slot(hf_folder, adapters):
    folder, _ = hf_folder
    root, _ = adapters
    model = load_model(folder)
    engine = Engine(model, AdapterStore(model.config, root), EngineConfig(kv_blocks=64, adapter_slots=2))
    got = _run(engine, {"a": ([1, 2], "all-r8"), "b": ([3, 4], "qv-r16"), "c": ([5, 6], "mlp-r4-rs")}, 3)
    assert all(len(v) == 3 for v in got.values())


def test_kv_exhaustion_preempts_the_newest_and_recomputes(hf_folder):
    folder, hf = hf_folder
    model = load_model(folder)
    engine = Engine(model, AdapterStore(model.config), EngineConfig(kv_blocks=5, block_size=4))
    jobs = {f"r{i}": ([10 + i, 20 + i, 30 + i], None) for i in range(3)}
    got = _run(engine, jobs, 8)  # 3 x 11 tokens need 9 blocks; only 5 exist
    assert engine.preemptions > 0
    for rid, (prompt, _) in jobs.items():
        assert got[rid] == _greedy_hf(hf, prompt, 8)


def test_stop_conditions_and_refusals(tmp_path):
    model = random_model(TINY_LLAMA)
    engine = Engine(model, AdapterStore(model.config), EngineConfig(kv_blocks=32, max_waiting=1))
    with pytest.raises(UnknownAdapterError, match="not served"):
        engine.add_request("u", [1, 2], "nope", SamplingParams())
    first = engine.add_request("s", [1, 2, 3], None, SamplingParams(max_tokens=3))
    from gpufleet.serve.protocol import OverloadedError

    with pytest.raises(OverloadedError):
        engine.add_request("t", [1, 2, 3], None, SamplingParams())
    chunks = []
    while engine.has_work():
        chunks += engine.step()
    assert [c.finish_reason for c in chunks] == [None, None, "length"] and first.finish_reason == "length"
    greedy_first = chunks[0].token_id
    engine.add_request("eos", [1, 2, 3], None, SamplingParams(max_tokens=5, stop_token_ids=(greedy_first,)))
    out = engine.step()
    assert out[0].finish_reason == "stop" and not engine.has_work()


def test_sampling_is_reproducible_for_a_seed():
    from gpufleet.serve.config import TINY_LLAMA

    model = random_model(TINY_LLAMA, seed=3)

    def sample(seed: int, mates: int) -> list[int]:
        engine = Engine(model, AdapterStore(model.config), EngineConfig(kv_blocks=64))
        jobs = {"me": ([4, 5, 6], None)} | {f"m{i}": ([7, i], None) for i in range(mates)}
        params = SamplingParams(max_tokens=8, temperature=1.5, top_p=0.9, seed=seed, ignore_eos=True)
        for rid, (prompt, _) in jobs.items():
            engine.add_request(rid, prompt, None, params)
        out = []
        while engine.has_work():
            out += [c.token_id for c in engine.step() if c.request_id == "me"]
        return out

    assert sample(1, 0) == sample(1, 3)  # batch-mates do not change a seeded request's output
    assert sample(1, 0) != sample(2, 0)


def test_adapter_errors(tmp_path, hf_folder):
    folder, _ = hf_folder
    config = load_model(folder).config
    with pytest.raises(ServeError, match=r"adapter_config\.json"):
        load_peft_adapter(tmp_path, config)
    small = random_model(TINY_LLAMA)
    save_model(small, tmp_path / "tiny")
    assert load_model(tmp_path / "tiny").config.hidden_size == 64
    with pytest.raises(ServeError, match="neither a model folder"):
        load_model(tmp_path / "missing")


def test_an_explicit_kernel_backend_gets_every_row_on_cpu(hf_folder, adapters):
    """The per-step CPU plans belong to the torch kernels: with another backend chosen (Triton under its CPU
    interpreter), the prompt and decode rows both go through that backend's add_lora, and outputs are unchanged."""
    import dataclasses

    from gpufleet.serve.ops import get_lora_ops

    folder, _ = hf_folder
    root, _ = adapters
    model = load_model(folder)
    jobs = {"a": ([5, 6, 7, 8, 9], "all-r8"), "b": ([11, 12, 13], "qv-r16")}
    reference = _run(
        Engine(model, AdapterStore(model.config, root), EngineConfig(kv_blocks=64, adapter_slots=4)), jobs, 4
    )
    torch_ops = get_lora_ops("torch")
    forms: list[str] = []

    def counting(y, x, a, b, scales, **kw):
        forms.append("rows" if kw.get("idx") is not None else "segments")
        return torch_ops.add_lora(y, x, a, b, scales, **kw)

    engine = Engine(model, AdapterStore(model.config, root), EngineConfig(kv_blocks=64, adapter_slots=4))
    engine.ops = dataclasses.replace(torch_ops, name="triton", add_lora=counting)
    assert _run(engine, jobs, 4) == reference
    assert "segments" in forms and "rows" in forms


def test_triton_step_plan_serves_every_row_in_one_launch_per_projection(hf_folder, adapters, monkeypatch):
    """With the Triton backend (its CPU interpreter here) the engine plans each step's rows once as tiles and every
    targeted projection runs one fused kernel over prompts and decodes together; outputs equal the torch path's."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1 from the start, as conftest sets on CPU)")
    pytest.importorskip("triton")
    from gpufleet.serve.ops import get_lora_ops, lora_triton

    folder, _ = hf_folder
    root, _ = adapters
    model = load_model(folder)
    jobs = {"a": ([5, 6, 7, 8, 9], "all-r8"), "b": ([11, 12, 13], "qv-r16"), "c": ([3, 4], None), "d": ([7], "all-r8")}
    config = EngineConfig(kv_blocks=64, adapter_slots=4, max_prefills_per_step=2)
    reference = _run(Engine(model, AdapterStore(model.config, root), config), jobs, 4)
    launches = []
    real = lora_triton.add_lora_tiles
    monkeypatch.setattr(lora_triton, "add_lora_tiles", lambda *a, **k: launches.append(a[-1].count) or real(*a, **k))
    engine = Engine(model, AdapterStore(model.config, root), config)
    engine.ops = get_lora_ops("triton")
    assert _run(engine, jobs, 4) == reference
    assert launches and engine.steps > 2  # mixed prompt + decode steps went through the fused kernel


def test_a_model_drawn_on_the_device_has_the_shape_dtype_and_spread_asked():
    """``random_model_on`` (the GPU bench's 7B path) draws on the device: norms 1, others normal(0, std)."""
    from gpufleet.serve.weights import random_model_on

    a = random_model_on(TINY_LLAMA, device="cpu", dtype=torch.float16, seed=5)
    b = random_model_on(TINY_LLAMA, device="cpu", dtype=torch.float16, seed=5)
    c = random_model_on(TINY_LLAMA, device="cpu", dtype=torch.float16, seed=6)
    ref = random_model(TINY_LLAMA)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert pa.dtype == torch.float16
        assert torch.equal(pa, pb), name
        if name.endswith("norm.weight"):
            assert bool((pa == 1).all()), name
        else:
            assert not torch.equal(pa, pc), name
            assert abs(float(pa.detach().float().std()) - 0.02) < 0.004, name
