"""Per-tenant token buckets, the fair admission queue, and ``/metrics`` (parsed with prometheus_client's own
parser, its token counters checked against what the openai client received)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_multitenant import KEY_A, KEY_ADMIN, KEY_B, oai, serving

from gpufleet.serve.fairness import FairQueue, RateLimiter, TenantLimitError, TokenBucket
from gpufleet.serve.fake_backend import FakeBackend
from gpufleet.serve.protocol import OverloadedError
from gpufleet.serve.server import create_app
from gpufleet.serve.tenants import Tenant, TenantRegistry, hash_key


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tenant(name: str, **limits) -> Tenant:
    return Tenant(name, hash_key(f"sk-{name}-0123456789"), ("*",), **limits)


def registry(**limits_of) -> TenantRegistry:
    tenants = [Tenant("a", hash_key(KEY_A), ("*",), **limits_of.get("a", {}))]
    tenants += [Tenant("b", hash_key(KEY_B), ("*",)), Tenant("ops", hash_key(KEY_ADMIN), ("*",), admin=True)]
    return TenantRegistry(tenants, source="test")


# ------------------------------------------------------------------------------------------- token buckets
def test_token_bucket_refills_at_its_rate_up_to_its_capacity():
    clock = Clock()
    bucket = TokenBucket(rate=2.0, capacity=4.0, clock=clock)
    assert bucket.wait_for(4) == 0 and bucket.wait_for(5) == float("inf")
    bucket.take(4)
    assert bucket.wait_for(1) == pytest.approx(0.5)
    clock.now += 10
    assert bucket.level == 0 and bucket.wait_for(4) == 0 and bucket.level == 4  # refilled, capped at capacity


def test_rate_limiter_charges_requests_and_tokens_and_refunds_unused_tokens():
    clock = Clock()
    limiter = RateLimiter(clock)
    a = tenant("a", requests_per_s=2.0, tokens_per_min=600)
    limiter.admit(a, 100)
    limiter.admit(a, 100)
    with pytest.raises(TenantLimitError) as info:  # the third request within the same instant
        limiter.admit(a, 1)
    assert info.value.reason == "requests_per_s" and info.value.retry_after_s == pytest.approx(0.5)
    clock.now += 1.0  # two more requests' worth; 10 tokens/s refilled 10 of the 200 spent
    with pytest.raises(TenantLimitError) as info:
        limiter.admit(a, 500)
    assert info.value.reason == "tokens_per_min" and info.value.retry_after_s == pytest.approx(9.0)
    limiter.refund(a, 90)  # the two requests generated less than they were charged for
    limiter.admit(a, 500)
    with pytest.raises(TenantLimitError) as info:
        limiter.admit(a, 601)
    assert info.value.reason == "request_too_large"
    limiter.admit(tenant("b"), 10**9)  # no limits, no buckets


# -------------------------------------------------------------------------------------------- fair queue
def test_fair_queue_gives_a_free_place_to_the_tenant_with_fewest_running_then_fcfs():
    a, b = tenant("a"), tenant("b")

    async def scenario() -> list[str]:
        queue = FairQueue(max_running=2, max_waiting=10)
        order: list[str] = []
        await queue.acquire(a)
        await queue.acquire(a)

        async def wait(who: Tenant, label: str) -> None:
            await queue.acquire(who)
            order.append(label)

        tasks = [asyncio.create_task(wait(a, "a1")), asyncio.create_task(wait(a, "a2"))]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(wait(b, "b1")))
        await asyncio.sleep(0)
        assert queue.waiting == 3 and order == []
        for _ in range(3):
            queue.release(a)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["b1", "a1", "a2"]  # b1 came last but b had nothing running


def test_fair_queue_bounds_each_tenants_share_and_the_whole_queue():
    a, b, c = tenant("a"), tenant("b"), tenant("c", max_queued=0)

    async def scenario() -> None:
        queue = FairQueue(max_running=1, max_waiting=4, queue_share=0.5)
        await queue.acquire(a)
        waiting = [asyncio.create_task(queue.acquire(a)) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(TenantLimitError) as info:  # a holds its half of the queue
            await queue.acquire(a)
        assert info.value.reason == "queue_share"
        with pytest.raises(TenantLimitError):  # c may not queue at all
            await queue.acquire(c)
        waiting += [asyncio.create_task(queue.acquire(b)) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError):  # the whole queue is full: everyone is refused
            await queue.acquire(tenant("d"))
        waiting[0].cancel()  # a client gone while waiting leaves the queue
        await asyncio.sleep(0)
        assert queue.waiting == 3
        for _ in range(3):  # each release hands the place to the next waiting request
            queue.release(a if queue._tenants["a"].running else b)
            await asyncio.sleep(0)
        await asyncio.gather(*waiting[1:])
        assert queue.running == 1 and queue.waiting == 0

    asyncio.run(scenario())


def test_a_flooding_tenant_gets_429_with_retry_after_and_the_other_tenant_none():
    """A sends 10x its requests_per_s at once; B's requests all pass and wait behind none of A's."""
    backend = FakeBackend(delay=0.002)
    app = create_app(backend, tenants=registry(a={"requests_per_s": 4.0}), max_running=2, max_waiting=64)
    with serving(app) as url:
        a, b = oai(url, KEY_A), oai(url, KEY_B)

        def call(client: openai.OpenAI, prompt: str) -> str:
            try:
                client.completions.create(model="alpha", prompt=prompt, max_tokens=20)
                return "ok"
            except openai.RateLimitError as exc:
                retry = int(exc.response.headers["retry-after"])
                assert retry >= 1 and exc.code == "requests_per_s" and "tenant 'a'" in exc.message
                return "429"

        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            flood = [pool.submit(call, a, f"a{i}") for i in range(40)]
            calm = [pool.submit(call, b, f"b{i}") for i in range(8)]
            outcomes_a = [f.result() for f in flood]
            outcomes_b = [f.result() for f in calm]
        elapsed = time.monotonic() - started
    assert outcomes_b == ["ok"] * 8
    # a burst of 4, then 4 a second for as long as the flood lasted: the bucket's bound, whatever the machine's speed
    assert 1 <= outcomes_a.count("ok") <= 4 + 4 * elapsed + 1
    assert outcomes_a.count("429") == 40 - outcomes_a.count("ok")


def test_queued_requests_of_a_busy_tenant_do_not_hold_back_another_tenant():
    """With both places taken by A and A's queue full, B's request is served before A's queued ones."""
    backend = FakeBackend(delay=0.01)
    app = create_app(backend, tenants=registry(), max_running=2, max_waiting=64)

    async def scenario(url: str) -> None:
        a = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY_A, max_retries=0)
        b = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY_B, max_retries=0)
        flood = [
            asyncio.create_task(a.completions.create(model="alpha", prompt=f"a{i}", max_tokens=30)) for i in range(8)
        ]
        while app.state.openai.queue.waiting < 6:
            await asyncio.sleep(0.005)
        await b.completions.create(model="beta", prompt="b", max_tokens=2)
        await asyncio.gather(*flood)

    with serving(app) as url:
        asyncio.run(scenario(url))
    prompts = [prompt for _, prompt, _, _ in backend.received]
    assert prompts.index("b") == 2  # right after the two that were running when it came


# ------------------------------------------------------------------------------------------------ metrics
def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, parsed by prometheus_client: {(name, sorted labels): value}."""
    r = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY_ADMIN}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def test_metrics_parse_and_token_counters_equal_what_clients_received():
    backend = FakeBackend(adapters=("alpha", "beta", "gamma"))
    app = create_app(backend, tenants=registry(a={"requests_per_s": 50.0}), max_running=4, max_label_values=3)
    with serving(app) as url:
        a, b = oai(url, KEY_A), oai(url, KEY_B)
        got: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
        for n in (1, 5, 9):
            r = a.completions.create(model="alpha", prompt="hello world", max_tokens=n)
            got["a"].append((r.usage.prompt_tokens, r.usage.completion_tokens))
        r = a.completions.create(model="alpha", prompt="hello world", max_tokens=11, stop=["o w"])
        got["a"].append((r.usage.prompt_tokens, r.usage.completion_tokens))
        stream = a.chat.completions.create(
            model="fake-base",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = next(c.usage for c in stream if c.usage is not None)
        got["a"].append((usage.prompt_tokens, usage.completion_tokens))
        for model in ("beta", "gamma", "beta"):
            stream = b.completions.create(
                model=model, prompt="abc", max_tokens=7, stream=True, stream_options={"include_usage": True}
            )
            usage = next(c.usage for c in stream if c.usage is not None)
            got["b"].append((usage.prompt_tokens, usage.completion_tokens))
        with pytest.raises(openai.AuthenticationError):
            oai(url, "sk-wrong-key-000000").completions.create(model="alpha", prompt="x")
        with pytest.raises(openai.NotFoundError):
            a.completions.create(model="delta", prompt="x")
        samples = scrape(url)
    for name in ("a", "b"):
        assert total(samples, "gpufleet_generation_tokens_total", tenant=name) == sum(c for _, c in got[name])
        assert total(samples, "gpufleet_prompt_tokens_total", tenant=name) == sum(p for p, _ in got[name])
    assert sum(c for _, c in got["a"]) == 1 + 5 + 9 + 7 + 6  # the stop string ended the fourth after 7 tokens
    assert total(samples, "gpufleet_requests_total", tenant="a", status="200") == 5
    assert total(samples, "gpufleet_requests_total", tenant="b", status="200") == 3
    assert total(samples, "gpufleet_requests_total", tenant="unauthenticated", status="401") == 1
    assert total(samples, "gpufleet_request_errors_total", tenant="a", adapter="none", code="model_not_found") == 1
    assert total(samples, "gpufleet_time_to_first_token_seconds_count") == 8
    assert total(samples, "gpufleet_inter_token_latency_seconds_count") == sum(
        c - 1 for g in got.values() for _, c in g
    )
    # three label values at most per label: alpha, base and beta came first, gamma is filed under "other"
    adapters = {dict(ls)["adapter"] for (n, ls) in samples if n == "gpufleet_generation_tokens_total"}
    assert adapters == {"alpha", "base", "beta", "other"}
    assert samples[("gpufleet_requests_running", ())] == 0 and samples[("gpufleet_requests_waiting", ())] == 0
    assert samples[("gpufleet_kv_blocks_used", ())] == 0 and samples[("gpufleet_kv_blocks_total", ())] == 1 << 20


def test_metrics_of_the_cpu_engine_count_adapter_slots():
    pytest.importorskip("torch")
    from gpufleet.serve.async_backend import AsyncEngine
    from gpufleet.serve.cluster import WorkerOptions, build_engine

    engine = build_engine(WorkerOptions(base="tiny-llama-random", random_adapters=3, adapter_slots=2, rank=4))
    backend = AsyncEngine(engine)
    try:
        with serving(create_app(backend, tenants=registry(), max_running=4)) as url:
            client = oai(url, KEY_ADMIN)
            for name in ("lora-0", "lora-0", "lora-1", "lora-2", "lora-0"):
                client.completions.create(model=name, prompt="hi", max_tokens=2, temperature=0)
            samples = scrape(url)
    finally:
        backend.close()
    # slots hold two: lora-0 loads, hits, lora-1 loads, lora-2 evicts lora-0, lora-0 loads again
    assert samples[("gpufleet_adapter_hits_total", ())] == 1
    assert samples[("gpufleet_adapter_misses_total", ())] == 4
    assert samples[("gpufleet_adapter_loads_total", ())] == 4
    assert samples[("gpufleet_adapter_evictions_total", ())] == 2
    assert samples[("gpufleet_kv_blocks_total", ())] == engine.config.kv_blocks
    assert samples[("gpufleet_kv_blocks_used", ())] == 0


def test_many_concurrent_streams_get_only_429_as_errors_and_leave_nothing_behind():
    """A small version of bench/serve_load.py: 100 streams at once, tenant a limited; the server ends empty."""
    backend = FakeBackend(delay=0.001)
    app = create_app(backend, tenants=registry(a={"requests_per_s": 10.0}), max_running=16, max_waiting=1024)

    async def run(url: str) -> tuple[dict[str, int], int]:
        clients = [openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=k, max_retries=0) for k in (KEY_A, KEY_B)]
        outcomes: dict[str, int] = {}
        received = [0]

        async def one(i: int) -> None:
            try:
                stream = await clients[i % 2].completions.create(
                    model="alpha", prompt=f"p{i}", max_tokens=4, stream=True, stream_options={"include_usage": True}
                )
                async for chunk in stream:
                    if chunk.usage is not None:
                        received[0] += chunk.usage.completion_tokens
                outcomes["ok"] = outcomes.get("ok", 0) + 1
            except openai.APIStatusError as exc:
                outcomes[str(exc.status_code)] = outcomes.get(str(exc.status_code), 0) + 1

        await asyncio.gather(*(one(i) for i in range(100)))
        return outcomes, received[0]

    with serving(app) as url:
        outcomes, received = asyncio.run(run(url))
        samples = scrape(url)
    server = app.state.openai
    assert set(outcomes) == {"ok", "429"} and outcomes["ok"] >= 50  # b's 50 all pass; a's beyond its burst get 429
    assert received == 4 * outcomes["ok"] == total(samples, "gpufleet_generation_tokens_total")
    assert server.in_flight == 0 and server.queue.running == 0 and server.queue.waiting == 0
    assert not server.adapter_use and backend.running == {}


def test_an_over_limit_request_is_refused_before_its_body_is_read():
    """The rate gate answers 429 before validation: a flood costs no body parsing (a bad body shows it)."""
    from fastapi.testclient import TestClient

    app = create_app(FakeBackend(), tenants=registry(a={"requests_per_s": 1.0}))
    client = TestClient(app)
    auth = {"Authorization": f"Bearer {KEY_A}", "content-type": "application/json"}
    body = {"model": "alpha", "prompt": "x", "max_tokens": 1}
    assert client.post("/v1/completions", json=body, headers=auth).is_success
    r = client.post("/v1/completions", content=b"{not json", headers=auth)
    assert r.status_code == 429 and r.json()["error"]["code"] == "requests_per_s" and int(r.headers["retry-after"]) >= 1
    other = {"Authorization": f"Bearer {KEY_B}", "content-type": "application/json"}
    assert client.post("/v1/completions", content=b"{not json", headers=other).status_code == 422  # b is not limited
