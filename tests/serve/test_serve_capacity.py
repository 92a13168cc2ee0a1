"""Punica's capacity model: roofline throughput per GPU, and inference servers needed over time."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from gpufleet.errors import ServeError
from gpufleet.serve.capacity import (
    SERVING_MODELS,
    LoRAServingModel,
    adapter_shares,
    decode_step,
    expected_distinct,
    lora_inference_load,
    lora_serving_loads,
    lora_serving_throughput,
    max_batch_that_fits,
    model_costs,
    peak_rps_for_pool,
)
from gpufleet.traces.inference import InferenceLoad


def test_llama2_7b_costs_match_its_published_size():
    costs = model_costs(SERVING_MODELS["llama2-7b"], rank=16)
    params = costs.resident_bytes / 2
    assert 6.6e9 < params < 6.8e9  # Llama-2-7B: 6.74 B parameters
    assert costs.kv_bytes_per_token == 2 * 32 * 4096 * 2  # 0.5 MiB per token in fp16
    assert costs.adapter_bytes / 2 == 32 * 16 * (4 * (4096 + 4096) + 3 * (4096 + 11008))


def test_more_distinct_adapters_lower_the_throughput_of_a_batch():
    rates = [lora_serving_throughput("a100-80g", "llama2-7b", 16, d, 32) for d in (0, 1, 4, 16, 32)]
    assert all(a > b for a, b in pairwise(rates))


def test_bigger_batches_serve_more_until_compute_bound():
    rates = [lora_serving_throughput("a100-80g", "llama2-7b", 16, 1, b) for b in (1, 2, 4, 8, 16, 32, 64)]
    assert all(a < b for a, b in pairwise(rates))
    # with almost no KV the step turns compute-bound and throughput stops growing
    big = [decode_step("a100-80g", "llama2-7b", 16, 1, b, context_tokens=1) for b in (4096, 8192)]
    assert [s.bound for s in big] == ["compute", "compute"]
    assert big[1].tokens_per_s == pytest.approx(big[0].tokens_per_s, rel=1e-3)
    small = decode_step("a100-80g", "llama2-7b", 16, 1, 8, context_tokens=1)
    assert small.bound == "memory" and small.tokens_per_s < big[0].tokens_per_s


def test_llama2_7b_on_an_a100_is_in_punicas_ballpark():
    """Punica (MLSys 2024): ~10^3 tokens/s on one A100-80GB for 7B at batch 32, 12x over one-adapter-at-a-time
    systems, +2 ms per token for its LoRA kernels. A roofline is an upper bound within a small factor of those."""
    mixed = decode_step("a100-80g", "llama2-7b", 16, 32, 32)
    assert 800 < mixed.tokens_per_s < 3000
    alone = decode_step("a100-80g", "llama2-7b", 16, 1, 1)
    assert 5 < mixed.tokens_per_s / alone.tokens_per_s < 30
    base = decode_step("a100-80g", "llama2-7b", 16, 0, 32)
    assert 0.5e-3 < mixed.seconds - base.seconds < 4e-3


def test_a_model_that_does_not_fit_names_the_ones_that_do():
    assert max_batch_that_fits("a100-80g", "llama2-7b", 16) >= 32
    with pytest.raises(ServeError, match=r"t4.*llama3\.2-3b"):
        max_batch_that_fits("t4", "llama2-7b", 16)
    with pytest.raises(ServeError, match="distinct_adapters"):
        decode_step("a100-80g", "llama2-7b", 16, 5, 4)
    with pytest.raises(ServeError, match="not one of"):
        decode_step("a100-80g", "no-such-model", 16, 1, 1)


def test_adapter_shares_and_expected_distinct():
    assert adapter_shares(4).tolist() == [0.25] * 4
    zipf = adapter_shares(100, "zipf")
    assert zipf.sum() == pytest.approx(1.0) and np.all(np.diff(zipf) < 0)
    assert float(expected_distinct(1.0, adapter_shares(10))) == pytest.approx(1.0)
    assert float(expected_distinct(32.0, adapter_shares(1, "identical"))) == pytest.approx(1.0)
    assert 20 < float(expected_distinct(32.0, adapter_shares(1000))) < 32
    with pytest.raises(ServeError, match="popularity"):
        adapter_shares(3, "bimodal")


def test_consolidated_serving_needs_fewer_gpus_than_per_adapter_serving():
    serving = LoRAServingModel()
    rates = np.array([0.5, 2.0, 10.0, 50.0])
    punica, per = serving.gpus_needed(rates, "gpufleet"), serving.gpus_needed(rates, "per_adapter")
    assert np.all(punica <= per) and np.all(punica[1:] < per[1:] / 2)
    assert np.all(np.diff(punica) > 0) and np.all(np.diff(per) > 0)


def test_inference_loads_free_servers_for_loaning():
    serving = LoRAServingModel(gpu="t4", model="llama3.2-3b")
    loads = lora_serving_loads("diurnal", pool_servers=96, until_s=2 * 86400, serving=serving)
    punica, per = loads["gpufleet"], loads["per_adapter"]
    assert isinstance(punica, InferenceLoad) and punica.name == "gpufleet:diurnal"
    assert np.array_equal(punica.time_s, per.time_s)
    assert np.all(punica.servers <= per.servers)
    assert per.servers.max() == 96  # by default the pool is sized for per-adapter serving at the peak
    freed = per.describe(0, 2 * 86400)["mean_servers_needed"] - punica.describe(0, 2 * 86400)["mean_servers_needed"]
    assert freed > 10


def test_explicit_rate_and_any_load_as_the_profile():
    serving = LoRAServingModel(gpu="a100-80g", model="llama2-7b")
    shape = InferenceLoad("mine", np.array([0.0, 3600.0]), np.array([5, 10]), 10)
    load = lora_inference_load(
        shape, pool_servers=20, until_s=7200, serving=serving, peak_rps=4.0, gpus_per_server=8, headroom=0.0
    )
    expected = np.ceil(serving.gpus_needed(np.array([2.0, 4.0]), "gpufleet") / 8)
    assert load.servers.tolist() == expected.astype(int).tolist()
    assert load.name == "gpufleet:mine"
    rps = peak_rps_for_pool(serving, 20, gpus_per_server=8, headroom=0.0)
    assert float(serving.gpus_needed(rps, "per_adapter")) == pytest.approx(160, rel=1e-6)
    with pytest.raises(ServeError, match="system"):
        lora_inference_load(shape, pool_servers=20, until_s=7200, system="vllm")


def test_genai_profile_is_the_default_shape():
    load = lora_inference_load(pool_servers=96, until_s=86400, serving=LoRAServingModel(gpu="a100-80g"))
    assert load.name == "gpufleet:genai" and load.pool_servers == 96
    assert load.servers.min() >= 0 and load.servers.max() <= 96


def test_simulate_inference_sources_batching_frees_servers():
    """`--inference punica` against `punica-per-adapter` on the default cluster: same traffic, fewer servers."""
    import numpy as np

    from gpufleet.sim.inference_load import punica_load
    from gpufleet.spec import load_cluster

    spec = load_cluster(None)
    pool = sum(p.nodes for p in spec.inference_pools)
    batched = punica_load(spec, "punica", "diurnal", pool, 3 * 86400.0)
    single = punica_load(spec, "punica-per-adapter", "diurnal", pool, 3 * 86400.0)
    grid = np.linspace(0, 3 * 86400.0 - 1, 500)

    def needed(load):
        return load.servers[np.searchsorted(load.time_s, grid, side="right") - 1]

    assert (needed(batched) <= needed(single)).all()
    assert needed(batched).mean() < 0.8 * needed(single).mean()
    assert needed(single).max() <= pool
