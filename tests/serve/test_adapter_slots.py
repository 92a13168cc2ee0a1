"""Adapter slots: an evicted adapter's slot is overwritten, not cleared first, and ends up holding exactly what a
fresh slot would (the new adapter zero-padded to the slots' rank, zeros for projections it does not target)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpufleet.serve.adapters import AdapterCache, AdapterStore, LoRAAdapter  # noqa: E402
from gpufleet.serve.bench import random_adapters  # noqa: E402
from gpufleet.serve.config import TINY_LLAMA  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _store() -> AdapterStore:
    store = AdapterStore(TINY_LLAMA)
    full = random_adapters(TINY_LLAMA, ["full"], rank=8, seed=1)[0]
    low = random_adapters(TINY_LLAMA, ["low"], rank=4, seed=2)[0]
    attention = {key: w for key, w in low.weights.items() if key[1] in ("q_proj", "v_proj")}
    for adapter in (full, LoRAAdapter("qv", 4, attention), random_adapters(TINY_LLAMA, ["mid"], rank=6, seed=3)[0]):
        store.add(adapter)
    return store


def _stacks(cache: AdapterCache) -> dict:
    return {key: (cache._a[key].cpu(), cache._b[key].cpu()) for key in cache._a}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_an_overwritten_slot_equals_a_fresh_one(device, dtype):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    store = _store()
    cache = AdapterCache(store, slots=1, max_rank=8, dtype=dtype, device=device)
    for name in ("full", "qv", "mid", "full", "qv"):  # every load evicts the previous adapter
        cache.release(name) if cache.acquire(name) == 0 else pytest.fail("one slot")
        fresh = AdapterCache(store, slots=1, max_rank=8, dtype=dtype, device=device)
        fresh.acquire(name)
        got, want = _stacks(cache), _stacks(fresh)
        for key in want:
            assert torch.equal(got[key][0], want[key][0]) and torch.equal(got[key][1], want[key][1]), (name, key)
            assert (cache.stacks(*key) is None) == (fresh.stacks(*key) is None), (name, key)
        a, _ = store.get(name).weights[(0, "q_proj")]
        assert torch.equal(got[(0, "q_proj")][0][0, :, : a.shape[1]], a.to(dtype))
    assert cache.stacks(0, "gate_proj") is None  # "qv" targets attention only
    assert cache.loads == 5 and cache.evictions == 4
