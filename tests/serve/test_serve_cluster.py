"""RemoteBackend (a server as a backend), the placement front end over remote servers, and the real cluster:
two engine worker processes behind ``python -m gpufleet.serve.cluster serve``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
import uvicorn

from gpufleet.errors import ServeError
from gpufleet.serve.fake_backend import FakeBackend
from gpufleet.serve.placement import PlacementFrontend
from gpufleet.serve.protocol import OverloadedError, SamplingParams, UnknownAdapterError
from gpufleet.serve.remote import RemoteBackend, RemoteBackendError
from gpufleet.serve.server import create_app


def free_port(span: int = 1) -> int:
    """A port p such that p .. p + span - 1 were all free a moment ago."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + span < 65535 and all(_free(port + k) for k in range(span)):
            return port
    raise RuntimeError("no free port range")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextmanager
def serving(backend: FakeBackend) -> Iterator[str]:
    """The OpenAI app over ``backend`` under uvicorn in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(backend), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=5)


def params(n: int = 4) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0)


async def collect(backend, prompt, adapter, n: int = 4, request_id: str = "r"):
    async with aclosing(backend.generate(prompt, adapter, params(n), request_id)) as stream:
        return [chunk async for chunk in stream]


# ---------------------------------------------------------------------------------------------- RemoteBackend
def test_remote_backend_lists_models_state_and_streams_text_and_token_prompts():
    fake = FakeBackend(base_model="base-x", adapters=("alpha", "beta"), total_blocks=77, max_batch=3)
    with serving(fake) as url:
        remote = RemoteBackend(url, count_tokens=len)
        remote.refresh()
        assert remote.base_model_name() == "base-x"
        assert remote.adapter_names() == ["alpha", "beta"]
        state = remote.state()
        assert (state["total_blocks"], state["max_batch"], state["block_size"]) == (77, 3, 16)
        assert remote.count_tokens("hello") == 5

        chunks = asyncio.run(collect(remote, "hello", "alpha", n=4))
        assert "".join(c.text for c in chunks) == "hell"
        assert [c.finish_reason for c in chunks] == [None, None, None, "length"]
        assert chunks[-1].completion_tokens == 4 and chunks[-1].prompt_tokens == 5
        assert all(c.request_id == "r" for c in chunks)

        assert [c.token_id for c in chunks] == [ord(ch) for ch in "hell"]  # the ids ride along (gpufleet's extension)

        chunks = asyncio.run(collect(remote, [ord("o"), ord("k")], None, n=3))
        assert "".join(c.text for c in chunks) == "oko"
        assert [c.token_id for c in chunks] == [ord("o"), ord("k"), ord("o")]
        received = fake.received[-1]
        assert received[1] == [ord("o"), ord("k")] and received[2] is None


def test_remote_backend_maps_http_errors_to_backend_errors():
    def reply(request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        status = {"missing": 404, "busy": 429, "bad": 422}.get(model, 500)
        code = {404: "model_not_found", 429: "overloaded"}.get(status)
        return httpx.Response(
            status, json={"error": {"message": f"{model} says no", "type": "x", "param": None, "code": code}}
        )

    remote = RemoteBackend("http://remote.test", transport=httpx.MockTransport(reply))
    for adapter, error in (
        ("missing", UnknownAdapterError),
        ("busy", OverloadedError),
        ("bad", ServeError),
        ("broken", RemoteBackendError),
    ):
        with pytest.raises(error, match="says no"):
            asyncio.run(collect(remote, "x", adapter))
    with pytest.raises(ServeError, match="ignore_eos"):
        asyncio.run(_ignore_eos(remote))


async def _ignore_eos(remote: RemoteBackend) -> None:
    stream = remote.generate("x", "alpha", SamplingParams(ignore_eos=True), "r")
    await anext(stream)


def test_remote_backend_unreachable_server_is_a_backend_failure_not_a_user_error():
    remote = RemoteBackend(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    with pytest.raises(RemoteBackendError, match=r"127\.0\.0\.1"):
        remote.refresh()


def test_closing_the_remote_stream_cancels_the_request_on_the_server():
    fake = FakeBackend(delay=0.02)
    with serving(fake) as url:
        remote = RemoteBackend(url)
        remote.refresh()

        async def two_then_close() -> None:
            async with aclosing(remote.generate("abcdef", "alpha", params(200), "r")) as stream:
                await anext(stream)
                await anext(stream)
            await remote.aclose()

        asyncio.run(two_then_close())
        deadline = time.monotonic() + 5
        while not fake.cancelled and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(fake.cancelled) == 1 and not fake.finished


def test_marked_down_remote_has_no_capacity_and_no_adapters():
    fake = FakeBackend()
    with serving(fake) as url:
        remote = RemoteBackend(url)
        remote.refresh()
        remote.mark_down("process exited with code -9")
        assert remote.adapter_names() == []
        assert remote.state()["max_batch"] == 0
        with pytest.raises(RemoteBackendError, match="down"):
            asyncio.run(collect(remote, "x", None))


def test_placement_over_remote_servers_consolidates_then_spills_to_the_other():
    """Max batch 1 per server: the second concurrent request must go to the other server."""
    fakes = [FakeBackend(delay=0.02, max_batch=1, instance_id=f"fake-{i}") for i in range(2)]
    with serving(fakes[0]) as url0, serving(fakes[1]) as url1:
        remotes = {"w0": RemoteBackend(url0), "w1": RemoteBackend(url1)}
        for remote in remotes.values():
            remote.refresh()
        frontend = PlacementFrontend(remotes)

        async def both() -> list[set[str]]:
            async def run(rid: str) -> set[str]:
                chunks = await collect(frontend, "hello", "alpha", n=10, request_id=rid)
                return {c.extra["instance"] for c in chunks}

            return await asyncio.gather(run("a"), run("b"))

        where = asyncio.run(both())
    assert sorted(where, key=sorted) == [{"w0"}, {"w1"}]
    assert all(len(f.finished) == 1 for f in fakes)


def test_a_token_id_prompt_migrates_between_remote_servers_by_its_ids():
    """KV runs out on one server: the newest request moves to the other, prefilled with prompt + generated ids."""
    fakes = [FakeBackend(instance_id=f"fake-{i}", total_blocks=6, block_size=4, delay=0.01) for i in range(2)]
    with serving(fakes[0]) as url0, serving(fakes[1]) as url1:
        remotes = {"w0": RemoteBackend(url0), "w1": RemoteBackend(url1)}
        for remote in remotes.values():
            remote.refresh()
        frontend = PlacementFrontend(remotes)

        async def both() -> list[list]:
            old = asyncio.create_task(collect(frontend, [ord(c) for c in "abcdefgh"], None, n=6, request_id="old"))
            await asyncio.sleep(0.005)
            new = asyncio.create_task(collect(frontend, [ord(c) for c in "ABCDEFGH"], None, n=6, request_id="new"))
            return [await old, await new]

        old, new = asyncio.run(both())
    assert frontend.placement.counters["migrations"] == 1
    mine = [ord(c) for c in "ABCDEFGH"]
    resumed = [r[1] for f in fakes for r in f.received if r[1][:8] == mine and len(r[1]) > 8]
    before = [c.token_id for c in new if c.extra["attempt"] == 1]  # what the first server generated
    assert before and resumed == [mine + before]  # the second attempt's prompt: real ids, no -1
    assert [c.completion_tokens for c in new] == [1, 2, 3, 4, 5, 6] and "".join(c.text for c in old) == "abcdef"


# --------------------------------------------------------------------------------------------- the real cluster
def _first_event(lines: Iterator[str]) -> dict:
    for line in lines:
        if line.startswith("data: "):
            return json.loads(line[len("data: ") :])
    raise AssertionError("the stream ended without an event")


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _worker_port(process: psutil.Process) -> int:
    args = process.cmdline()
    return int(args[args.index("--port") + 1])


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def test_cluster_of_two_engine_workers_spreads_when_full_survives_a_dead_worker_and_shuts_down(tmp_path: Path):
    port = free_port(span=3)
    front, states = f"http://127.0.0.1:{port}", [f"http://127.0.0.1:{port + 1 + i}/v1/state" for i in range(2)]
    log_path = tmp_path / "cluster.log"
    cmd = [
        sys.executable,
        "-m",
        "gpufleet.serve.cluster",
        "serve",
        "--base",
        "tiny-llama-random",
        "--instances",
        "2",
        "--port",
        str(port),
        "--max-batch",
        "1",
        "--random-adapters",
        "2",
        "--rank",
        "4",
        "--threads",
        "1",
        "--kv-blocks",
        "256",
    ]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ})
    workers: list[psutil.Process] = []
    try:
        _wait_for(lambda: _healthy(front) or proc.poll() is not None, 90, "the front end")
        assert proc.poll() is None, log_path.read_text()
        workers = sorted(psutil.Process(proc.pid).children(recursive=True), key=_worker_port)
        assert [_worker_port(w) for w in workers] == [port + 1, port + 2]
        assert [m["id"] for m in httpx.get(f"{front}/v1/models").json()["data"]] == [
            "tiny-llama-random",
            "lora-0",
            "lora-1",
        ]

        # greedy "hello" runs past 300 tokens without EOS on both adapters of the seeded random model (about 1 s):
        # the first request still runs when the second arrives
        body = {
            "prompt": "hello",
            "max_tokens": 300,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.Client(base_url=front, timeout=30) as client:
            with (
                client.stream("POST", "/v1/completions", json={**body, "model": "lora-0"}) as first,
                client.stream("POST", "/v1/completions", json={**body, "model": "lora-1"}) as second,
            ):
                lines = [first.iter_lines(), None]
                _first_event(lines[0])  # the first request runs (batch 1 = full) before the second is sent
                lines[1] = second.iter_lines()
                _first_event(lines[1])
                served = [httpx.get(u).json()["served"] for u in states]
                assert served == [1, 1], "with max batch 1 the second request must go to the other worker"
                usages = [[json.loads(x[6:]) for x in rest if x.startswith("data: {")][-1]["usage"] for rest in lines]
            assert [u["completion_tokens"] for u in usages] == [300, 300]
            assert [u["prompt_tokens"] for u in usages] == [6, 6]  # BOS + 5 bytes

            workers[1].kill()  # a worker dies: reported, taken out of placement, the other serves
            _wait_for(lambda: b"exited with code" in log_path.read_bytes(), 10, "the dead worker's report")
            r = client.post("/v1/completions", json={**body, "model": "lora-1", "stream": False, "max_tokens": 3})
            assert r.status_code == 200, r.text
            assert httpx.get(states[0]).json()["served"] == 2

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log_path.read_text()
        _, alive_procs = psutil.wait_procs(workers, timeout=5)
        assert not alive_procs, f"workers left behind: {alive_procs}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for worker in workers:
            if worker.is_running():
                worker.kill()


def test_state_route_reports_the_backend_state_or_404():
    from fastapi.testclient import TestClient

    class Stateless:
        def base_model_name(self) -> str:
            return "b"

        def adapter_names(self) -> list[str]:
            return []

    assert TestClient(create_app(FakeBackend(total_blocks=9))).get("/v1/state").json()["total_blocks"] == 9
    r = TestClient(create_app(Stateless())).get("/v1/state")
    assert r.status_code == 404 and r.json()["error"]["code"] == "no_state"
