"""Punica's placement: consolidation, affinity, memory, FCFS head-of-line, eviction/migration; the front end."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.errors import ServeError
from gpufleet.serve.fake_backend import FakeBackend
from gpufleet.serve.placement import (
    InstanceState,
    PlacementFrontend,
    PlacementRequest,
    PunicaPlacement,
    RunningRequest,
    blocks_for,
)
from gpufleet.serve.protocol import OverloadedError, SamplingParams, UnknownAdapterError
from gpufleet.serve.server import create_app


def inst(
    iid: str,
    total: int = 1000,
    *,
    max_batch: int = 32,
    block_size: int = 16,
    running: list[tuple[float, str, str | None, int]] = (),
) -> InstanceState:
    return InstanceState(iid, total, block_size, max_batch, {r[1]: RunningRequest(*r) for r in running})


def req(rid: str, arrival: float, tokens: int = 16, lora: str | None = None) -> PlacementRequest:
    return PlacementRequest(rid, lora, tokens, arrival)


def test_blocks_for_rounds_up():
    assert [blocks_for(n, 16) for n in (1, 16, 17, 32, 33)] == [1, 1, 2, 2, 3]


# ----------------------------------------------------------------------------------------- choose_instance
def test_consolidation_fills_the_busiest_instance_first():
    p = PunicaPlacement([inst("a", max_batch=3), inst("b", max_batch=3), inst("c", max_batch=3)])
    placed = [p.submit(req(f"r{i}", i)).placed[0][1] for i in range(7)]
    # empty instances tie: the larger id wins; then the busiest one is filled until its batch is full
    assert placed == ["c", "c", "c", "b", "b", "b", "a"]
    assert p.counters["placements"] == 7


def test_busiest_wins_over_adapter_affinity():
    p = PunicaPlacement(
        [inst("a", running=[(0, "x", "lora1", 16)]), inst("b", running=[(0, "y", "lora2", 16), (1, "z", "lora2", 16)])]
    )
    assert p.choose_instance(req("n", 5, lora="lora1")) == "b"


def test_adapter_affinity_breaks_a_tie_in_batch_size():
    p = PunicaPlacement([inst("a", running=[(0, "x", "lora1", 16)]), inst("b", running=[(0, "y", "lora2", 16)])])
    assert p.choose_instance(req("n", 5, lora="lora1")) == "a"
    assert p.choose_instance(req("n", 5, lora="lora2")) == "b"


def test_fewest_free_blocks_breaks_a_tie_after_affinity():
    p = PunicaPlacement([inst("a", total=100), inst("b", total=50), inst("c", total=80)])
    assert p.choose_instance(req("n", 0)) == "b"  # best fit


def test_instances_without_memory_for_prompt_plus_one_block_per_request_are_skipped():
    busy = [(0, f"x{i}", None, 16) for i in range(3)]  # 3 blocks held
    # prompt 40 tokens = 3 blocks, plus (batch + 1) = 4 decode blocks: 7 free blocks needed
    exact = PunicaPlacement([inst("a", total=3 + 7, running=busy), inst("b")])
    assert exact.choose_instance(req("n", 5, tokens=40)) == "a"
    short = PunicaPlacement([inst("a", total=3 + 6, running=busy), inst("b")])
    assert short.choose_instance(req("n", 5, tokens=40)) == "b"


def test_full_batches_are_skipped_and_nothing_fits_returns_none():
    p = PunicaPlacement([inst("a", max_batch=1, running=[(0, "x", None, 1)]), inst("b", total=2)])
    assert p.choose_instance(req("n", 1, tokens=16)) == "b"  # 1 block + 1 decode block
    assert p.choose_instance(req("n", 1, tokens=17)) is None


def test_allowed_instances_restrict_the_choice():
    p = PunicaPlacement([inst("a"), inst("b")])
    r = PlacementRequest("n", "lora", 16, 0.0, instances=frozenset({"a"}))
    assert p.choose_instance(r) == "a"


# --------------------------------------------------------------------------------------------------- queue
def test_queue_is_fcfs_with_head_of_line_blocking():
    p = PunicaPlacement([inst("a", total=10)])
    p.submit(req("big1", 0.0, tokens=16 * 8))  # 8 blocks + 1: placed
    assert p.submit(req("big2", 1.0, tokens=16 * 8)).placed == []  # needs 8 + 2: waits
    assert p.submit(req("small", 2.0, tokens=1)).placed == []  # would fit, but waits behind big2
    assert [r.request_id for r in p.queue] == ["big2", "small"]
    decisions = p.finish("big1")
    assert decisions.placed == [("big2", "a")]
    assert [r.request_id for r in p.queue] == ["small"]  # 1 + 2 decode blocks do not fit beside big2


def test_queue_orders_by_arrival_not_submission():
    p = PunicaPlacement([inst("a", max_batch=1, running=[(0, "x", None, 1)])])
    p.submit(req("late", 5.0))
    p.submit(req("early", 2.0))
    assert [r.request_id for r in p.queue] == ["early", "late"]
    assert p.finish("x").placed == [("early", "a")]


def test_duplicate_request_ids_are_refused():
    p = PunicaPlacement([inst("a")])
    p.submit(req("r", 0))
    with pytest.raises(ServeError, match="unique"):
        p.submit(req("r", 1))


def test_finish_of_a_queued_request_removes_it():
    p = PunicaPlacement([inst("a", max_batch=1, running=[(0, "x", None, 1)])])
    p.submit(req("w", 1))
    p.finish("w")
    assert p.queue == [] and p.finish("unknown").placed == []


# ------------------------------------------------------------------------------------------------ eviction
def crowded() -> PunicaPlacement:
    """Instance a: three requests (arrivals 1, 2, 3) that have grown to fill it; b is empty."""
    running = [(1.0, "old", None, 12), (2.0, "mid", "l", 12), (3.0, "new", None, 9)]
    return PunicaPlacement([inst("a", total=12, block_size=4, running=running), inst("b", total=6, block_size=4)])


def test_on_step_evicts_the_newest_and_migrates_it_by_recomputation():
    p = crowded()
    assert p.instances["a"].free_blocks == 12 - 3 - 3 - 3 == 3
    p.on_token("a", "new", 4)  # 13 tokens -> 4 blocks: free 2 < batch 3
    decisions = p.on_step("a")
    assert decisions.evicted == ["new"]
    assert decisions.placed == [("new", "b")]  # 13 tokens = 4 blocks + 1 decode block <= 6 free on b
    moved = p.instances["b"].running["new"]
    assert (moved.arrival, moved.tokens) == (3.0, 13)  # original arrival; prompt = prompt + generated
    assert p.requests["new"].migrations == 1 and p.counters["migrations"] == 1
    assert [e.kind for e in p.events[-3:]] == ["evict", "queue", "place"]
    assert p.instances["a"].free_blocks >= p.instances["a"].batch_size


def test_oldest_eviction_reproduces_punicas_code():
    p = crowded()
    p.evict = "oldest"
    p.on_token("a", "new", 4)
    assert p.on_step("a").evicted == ["old"]


def test_on_step_does_nothing_when_every_request_has_a_block():
    p = crowded()
    assert p.on_step("a").evicted == []


def test_evicted_request_keeps_its_place_ahead_of_newer_requests():
    p = crowded()
    p.add_instance(inst("c", total=6, block_size=4, running=[(0.5, "blocker", None, 8)]))  # 4 free blocks
    del p.instances["b"]
    assert p.submit(req("newer", 9.0, tokens=16)).placed == []  # 4 blocks + decode blocks: fits nowhere
    p.on_token("a", "new", 4)
    decisions = p.on_step("a")
    assert decisions.evicted == ["new"] and decisions.placed == []
    assert [r.request_id for r in p.queue] == ["new", "newer"]  # arrival 3 goes ahead of arrival 9
    assert p.finish("blocker").placed == [("new", "c")]
    assert [r.request_id for r in p.queue] == ["newer"]


def test_a_request_that_outgrew_every_instance_is_dropped():
    p = PunicaPlacement([inst("a", total=4, block_size=4)])
    p.submit(req("r", 0.0, tokens=4))
    p.on_token("a", "r", 12)  # 16 tokens = 4 blocks: no block left for the next token
    decisions = p.on_step("a")
    assert decisions.dropped == ["r"] and "r" not in p.requests and p.counters["dropped"] == 1


# ------------------------------------------------------------------------------------------------ invariants
submits = st.tuples(st.just("submit"), st.sampled_from([None, "x", "y", "z"]), st.integers(1, 60))
steps = st.tuples(st.just("step"), st.integers(0, 2), st.integers(1, 40))
finishes = st.tuples(st.just("finish"), st.integers(0, 50), st.none())
ops = st.lists(st.one_of(submits, submits, steps, steps, finishes), min_size=10, max_size=60)


def check_invariants(p: PunicaPlacement, live: set[str]) -> None:
    seen = [rid for i in p.instances.values() for rid in i.running] + [r.request_id for r in p.queue]
    assert len(seen) == len(set(seen)), "a request is in two places at once"
    assert set(seen) == live == set(p.requests)
    for i in p.instances.values():
        assert i.batch_size <= i.max_batch
        assert i.free_blocks >= 0
        assert all(p.location[rid] == i.instance_id for rid in i.running)
    assert [(r.arrival, r.request_id) for r in p.queue] == sorted((r.arrival, r.request_id) for r in p.queue)
    if p.queue:
        assert p.choose_instance(p.queue[0]) is None  # the head waits only if it fits nowhere


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_workloads_keep_the_invariants(operations):
    p = PunicaPlacement(
        [
            inst("a", 24, max_batch=3, block_size=4),
            inst("b", 40, max_batch=4, block_size=4),
            inst("c", 16, max_batch=2, block_size=4),
        ]
    )
    live: set[str] = set()
    names = itertools.count()
    for t, (op, arg, size) in enumerate(operations):
        if op == "submit":
            r = PlacementRequest(f"r{next(names)}", arg, size, float(t))
            if p.fits_somewhere(r):
                p.submit(r)
                live.add(r.request_id)
        elif op == "step":
            iid = "abc"[arg]
            live -= set(p.on_step(iid).dropped)
            check_invariants(p, live)
            for rid in list(p.instances[iid].running):  # the step appends one token to each running request
                p.on_token(iid, rid, 1)
            for _ in range(size - 1):  # and a few more steps' worth, checked each time
                live -= set(p.on_step(iid).dropped)
                for rid in list(p.instances[iid].running):
                    p.on_token(iid, rid, 1)
        elif live:
            victim = sorted(live)[arg % len(live)]
            p.finish(victim)
            live.discard(victim)
        check_invariants(p, live)


# ---------------------------------------------------------------------------------------------- front end
async def drain(frontend: PlacementFrontend, prompt, adapter, max_tokens: int, rid: str) -> list:
    return [c async for c in frontend.generate(prompt, adapter, SamplingParams(max_tokens=max_tokens), rid)]


def fakes(n: int = 3, **kwargs) -> dict[str, FakeBackend]:
    return {f"gpu{i}": FakeBackend(instance_id=f"gpu{i}", **kwargs) for i in range(n)}


async def gather_requests(frontend: PlacementFrontend, *specs) -> list[list]:
    """Run requests concurrently; they are submitted in order, before any backend produces a token."""
    return await asyncio.gather(*[drain(frontend, *spec) for spec in specs])


def test_frontend_consolidates_concurrent_requests_on_one_instance():
    backends = fakes(3, delay=0.003)
    frontend = PlacementFrontend(backends)
    results = asyncio.run(gather_requests(frontend, *[("hello", "alpha", 5, f"r{i}") for i in range(4)]))
    assert {c.extra["instance"] for chunks in results for c in chunks} == {"gpu2"}
    assert all("".join(c.text for c in chunks) == "hello" for chunks in results)
    assert [len(b.finished) for b in backends.values()] == [0, 0, 4]
    assert frontend.placement.counters["placements"] == 4 and frontend.placement.requests == {}


def test_frontend_sends_an_adapter_only_where_it_is_served():
    backends = {
        "gpu0": FakeBackend(instance_id="gpu0", adapters=["alpha", "rare"]),
        "gpu1": FakeBackend(instance_id="gpu1", adapters=["alpha"]),
    }
    frontend = PlacementFrontend(backends)
    assert frontend.adapter_names() == ["alpha", "rare"]
    chunks = asyncio.run(drain(frontend, [7, 8], "rare", 3, "r"))
    assert {c.extra["instance"] for c in chunks} == {"gpu0"}
    assert [c.token_id for c in chunks] == [7, 8, 7] and chunks[-1].finish_reason == "length"


def test_frontend_refuses_unknown_adapters_and_a_full_queue():
    frontend = PlacementFrontend(fakes(1, max_batch=1, delay=0.01), max_queue=1)
    with pytest.raises(UnknownAdapterError, match="'nope'"):
        asyncio.run(drain(frontend, "x", "nope", 1, "r"))

    async def overflow() -> None:
        busy = asyncio.create_task(drain(frontend, "busy", None, 20, "a"))
        waiting = asyncio.create_task(drain(frontend, "wait", None, 2, "b"))
        await asyncio.sleep(0.02)
        with pytest.raises(OverloadedError, match="waiting"):
            await drain(frontend, "x", None, 1, "c")
        assert len(await waiting) == 2 and len(await busy) == 20

    asyncio.run(overflow())


def test_frontend_rejects_mixed_base_models_and_oversized_prompts():
    with pytest.raises(ServeError, match="same base model"):
        PlacementFrontend({"a": FakeBackend(), "b": FakeBackend(base_model="other")})
    frontend = PlacementFrontend(fakes(1, total_blocks=2, block_size=4))
    with pytest.raises(ServeError, match="KV cache"):
        asyncio.run(drain(frontend, "x" * 9, None, 1, "r"))


def test_frontend_migrates_the_newest_request_with_prompt_plus_generated():
    clock = itertools.count().__next__
    backends = {
        "gpu0": FakeBackend(instance_id="gpu0", total_blocks=6, block_size=4, delay=0.002),
        "gpu1": FakeBackend(instance_id="gpu1", total_blocks=6, block_size=4, delay=0.002),
    }
    frontend = PlacementFrontend(backends, clock=clock)
    # both start on gpu1 (tie -> larger id, then the busiest): 2 + 2 blocks of 6; growing past 8 tokens each
    # needs a third block apiece, so gpu1 evicts the newest request, which moves to gpu0
    old, new = asyncio.run(gather_requests(frontend, ("abcdefgh", None, 6, "old"), ("ABCDEFGH", None, 6, "new")))
    assert "".join(c.text for c in old) == "abcdef" and {c.extra["instance"] for c in old} == {"gpu1"}
    assert [c.completion_tokens for c in new] == [1, 2, 3, 4, 5, 6] and new[-1].finish_reason == "length"
    assert {c.request_id for c in new} == {"new"} and {c.prompt_tokens for c in new} == {8}
    assert [c.extra["instance"] for c in new][-1] == "gpu0"
    generated_before = "".join(c.text for c in new if c.extra["instance"] == "gpu1")
    rid, prompt, _, params = backends["gpu0"].received[0]
    assert rid == "new~1" and prompt == "ABCDEFGH" + generated_before
    assert params.max_tokens == 6 - len(generated_before)
    assert frontend.placement.counters["migrations"] == 1
    assert backends["gpu1"].cancelled == ["new"]


def test_frontend_reads_engine_style_state_dicts():
    class DictState(FakeBackend):
        def state(self) -> dict[str, int]:  # what Engine.state() reports
            return {"batch": 0, "max_batch": 2, "waiting": 0, "free_blocks": 50, "block_size": 8}

    frontend = PlacementFrontend({"e": DictState(instance_id="e")})
    assert (frontend.placement.instances["e"].total_blocks, frontend.placement.instances["e"].max_batch) == (50, 2)
    assert "".join(c.text for c in asyncio.run(drain(frontend, "hi", "beta", 2, "r"))) == "hi"


def test_the_http_server_serves_through_the_frontend():
    backends = {
        "gpu0": FakeBackend(instance_id="gpu0", adapters=["alpha"]),
        "gpu1": FakeBackend(instance_id="gpu1", adapters=["beta"]),
    }
    c = TestClient(create_app(PlacementFrontend(backends)), raise_server_exceptions=False)
    assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["fake-base", "alpha", "beta"]
    r = c.post("/v1/completions", json={"model": "beta", "prompt": "hi", "max_tokens": 3})
    assert r.json()["choices"][0]["text"] == "hih" and backends["gpu1"].finished and not backends["gpu0"].received
    small = PlacementFrontend({"gpu0": FakeBackend(instance_id="gpu0", total_blocks=2, block_size=4)})
    too_long = TestClient(create_app(small)).post("/v1/completions", json={"model": "fake-base", "prompt": "x" * 9})
    assert too_long.status_code == 400 and "KV cache" in too_long.json()["error"]["message"]
