"""The paged KV cache: block tables map tokens to pool positions, and gather reads them back in any layout."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpufleet.errors import ServeError  # noqa: E402
from gpufleet.serve.kv_cache import KVCache  # noqa: E402


def _filled(layers=2, blocks=8, block=4, heads=2, dim=3):
    kv = KVCache(layers, blocks, block, heads, dim)
    positions = torch.arange(blocks * block)
    for layer in range(layers):
        values = torch.randn(blocks * block, heads, dim)
        kv.write(layer, positions, values, -values)
    return kv


def test_gather_matches_plain_indexing_for_every_layer_and_table_shape():
    kv = _filled()
    tables = [
        torch.tensor([[0, 5, 9, 31], [3, 3, 0, 0]]),
        torch.tensor([[7]]),
        torch.randint(0, 32, (5, 11)),
        torch.tensor([[1, 2], [30, 31]]),
    ]
    for table in tables:  # larger, smaller, larger again: the reused buffers must never leak old contents
        for layer in range(2):
            k, v = kv.gather(layer, table)
            assert k.shape == (*table.shape, 2, 3)
            assert torch.equal(k, kv.k[layer][table]) and torch.equal(v, kv.v[layer][table])


def test_gather_reuses_its_buffers_instead_of_allocating_per_call():
    kv = _filled()
    k1, _ = kv.gather(0, torch.randint(0, 32, (4, 6)))
    k2, _ = kv.gather(1, torch.randint(0, 32, (3, 5)))
    assert k1.data_ptr() == k2.data_ptr()


def test_slots_follow_the_block_table_and_exhaustion_is_an_error():
    kv = KVCache(1, 4, 4, 1, 1)
    blocks = kv.allocator.allocate(2)
    assert kv.slots([2, 0], 2, 4).tolist() == [10, 11, 0, 1]
    assert kv.allocator.free == 2
    with pytest.raises(ServeError, match="exhausted"):
        kv.allocator.allocate(3)
    kv.allocator.release(blocks)
    assert kv.allocator.free == 4


def test_decode_groups_cover_every_row_once_and_pad_at_most_twofold():
    from gpufleet.serve.lora_llama import GROUP_FILL, decode_groups

    lengths = [3, 40, 41, 7, 19, 2, 80, 39, 5]
    contexts = [torch.arange(100, 100 + n) for n in lengths]
    groups = decode_groups(contexts)
    rows = sorted(int(r) for g in groups for r in g.rows)
    assert rows == list(range(len(lengths)))
    assert len(groups) > 1
    for g in groups:
        members = [lengths[int(r)] for r in g.rows]
        assert g.slot_table.shape == (len(members), max(members))
        assert min(members) >= GROUP_FILL * max(members)
        assert g.mask.sum(-1).flatten().tolist() == members
        for row, r in enumerate(g.rows.tolist()):
            assert torch.equal(g.slot_table[row, : lengths[r]], contexts[r])


def test_grouped_decode_attention_gives_the_outputs_of_one_padded_table(monkeypatch):
    import gpufleet.serve.lora_llama as model_module
    from gpufleet.serve.adapters import AdapterStore
    from gpufleet.serve.continuous_batching import Engine, EngineConfig
    from gpufleet.serve.protocol import SamplingParams
    from gpufleet.serve.weights import load_model

    model = load_model("tiny-llama-random")
    prompts = {f"r{n}": [(5 * n + i) % 250 for i in range(n)] for n in (2, 3, 9, 17, 30, 31)}

    def run() -> dict[str, list[int]]:
        engine = Engine(model, AdapterStore(model.config), EngineConfig(kv_blocks=64))
        for rid, prompt in prompts.items():
            engine.add_request(rid, prompt, None, SamplingParams(max_tokens=8, ignore_eos=True))
        out: dict[str, list[int]] = {rid: [] for rid in prompts}
        while engine.has_work():
            for chunk in engine.step():
                out[chunk.request_id].append(chunk.token_id)
        return out

    grouped = run()
    monkeypatch.setattr(model_module, "GROUP_FILL", 0.0)  # every decode row in one table padded to the longest
    assert run() == grouped
