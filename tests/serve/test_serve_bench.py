"""The Punica benchmark's bookkeeping: latencies split into first token and decode gaps, and the bar's ratios."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from gpufleet.serve.adapters import AdapterStore
from gpufleet.serve.bench import (
    WorkloadConfig,
    bar_rows,
    make_workload,
    median_run,
    random_adapters,
    run_system,
)
from gpufleet.serve.continuous_batching import EngineConfig
from gpufleet.serve.weights import load_model


@pytest.fixture(scope="module")
def tiny():
    model = load_model("tiny-llama-random")
    workload = WorkloadConfig(requests=40, batch=8, max_output=12, max_prompt=16)
    requests = make_workload(workload, "distinct", model.config.vocab_size)
    store = AdapterStore(model.config)
    for adapter in random_adapters(model.config, sorted({r.adapter for r in requests}), 4):
        store.add(adapter)
    config = EngineConfig(max_batch=8, adapter_slots=8, max_rank=4, kv_blocks=256)
    return model, store, requests, config


@pytest.mark.parametrize("system", ["gpufleet", "per_adapter", "base_only"])
def test_every_token_is_either_a_first_token_or_a_decode_gap(tiny, system):
    model, store, requests, config = tiny
    row = run_system(system, model, store, requests, config)
    assert row["generated_tokens"] == sum(r.output_len for r in requests)
    assert row["p50_first_token_s"] > 0 and row["p50_token_latency_ms"] > 0
    assert row["p99_token_latency_ms"] >= row["p50_token_latency_ms"]


def test_continuous_batching_keeps_the_batch_full_across_batches(tiny):
    """40 requests with at most 8 in flight: the engine refills from the queue, so it takes far fewer steps than
    serving the five batches one after another (each as long as its longest request)."""
    model, store, requests, config = tiny
    row = run_system("base_only", model, store, requests, config)
    batch_by_batch = sum(max(r.output_len for r in requests[i : i + 8]) for i in range(0, 40, 8))
    assert row["steps"] < batch_by_batch
    assert row["steps"] >= sum(r.output_len for r in requests) / 8


def _result(popularity, gpufleet, per_adapter, base_only):
    return {
        "popularity": popularity,
        "systems": {
            "gpufleet": {"tokens_per_s": gpufleet},
            "per_adapter": {"tokens_per_s": per_adapter},
            "base_only": {"tokens_per_s": base_only},
        },
    }


def test_bar_is_judged_on_distinct_only():
    rows = bar_rows(
        [
            _result("distinct", 800.0, 100.0, 1100.0),
            _result("uniform", 800.0, 400.0, 900.0),
            _result("distinct", 700.0, 100.0, 1100.0),
            _result("distinct", 900.0, 100.0, 1400.0),
        ]
    )
    assert [r["met"] for r in rows] == [True, None, False, False]
    assert rows[0]["per_adapter_speedup"] == pytest.approx(8.0)
    assert rows[3]["base_only_slowdown"] == pytest.approx(1400 / 900)
    assert bar_rows([{"popularity": "distinct", "systems": {"gpufleet": {"tokens_per_s": 1.0}}}]) == []


def test_median_run_reports_the_middle_run_and_keeps_every_throughput():
    runs = [{"tokens_per_s": t, "p50_token_latency_ms": 1000 / t} for t in (900.0, 1200.0, 1000.0)]
    chosen = median_run(runs)
    assert chosen["tokens_per_s"] == 1000.0 and chosen["p50_token_latency_ms"] == 1.0
    assert chosen["tokens_per_s_runs"] == [900.0, 1200.0, 1000.0]
    assert median_run(runs[:2])["tokens_per_s"] == 900.0
    assert "tokens_per_s_runs" not in runs[2]
