"""The OpenAI-compatible server over the fake backend: formats, streaming, stop strings, errors, cancellation."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from gpufleet.errors import ServeError
from gpufleet.serve.fake_backend import FakeBackend
from gpufleet.serve.openai_schema import ChatMessage
from gpufleet.serve.protocol import GenerationChunk, SamplingParams
from gpufleet.serve.server import StopMatcher, create_app, render_chat


def client(backend: FakeBackend | None = None, **kwargs) -> TestClient:
    return TestClient(create_app(backend or FakeBackend(), **kwargs), raise_server_exceptions=False)


def sse_events(text: str) -> list[dict | str]:
    """Parse an SSE body: every event must be ``data: ...`` followed by a blank line."""
    events: list[dict | str] = []
    for block in text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def completion(c: TestClient, **body) -> httpx.Response:
    return c.post("/v1/completions", json={"model": "fake-base", "temperature": 0, **body})


def assert_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# ---------------------------------------------------------------------------------------------- happy paths
def test_models_lists_the_base_model_and_every_adapter():
    r = client().get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert [(m["id"], m["parent"]) for m in body["data"]] == [
        ("fake-base", None),
        ("alpha", "fake-base"),
        ("beta", "fake-base"),
    ]
    assert all(m["object"] == "model" and m["owned_by"] == "gpufleet" for m in body["data"])


def test_served_model_name_is_an_alias_of_the_base():
    c = client(model_name="my-llama")
    assert c.get("/v1/models").json()["data"][0]["id"] == "my-llama"
    assert completion(c, model="my-llama", prompt="ab", max_tokens=2).status_code == 200
    assert completion(c, model="fake-base", prompt="ab", max_tokens=2).status_code == 200


def test_completion_returns_openai_json_with_usage():
    backend = FakeBackend()
    r = completion(client(backend), model="alpha", prompt="hello", max_tokens=7, seed=3, top_p=0.5)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "alpha" and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"index": 0, "text": "hellohe", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    _, prompt, adapter, params = backend.received[0]
    assert (prompt, adapter) == ("hello", "alpha")
    assert params == SamplingParams(max_tokens=7, temperature=0.0, top_p=0.5, seed=3)


def test_completion_stream_is_sse_ending_with_done():
    c = client()
    with c.stream(
        "POST", "/v1/completions", json={"model": "beta", "prompt": "hey", "max_tokens": 5, "stream": True}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.read().decode())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(e["object"] == "text_completion" and e["model"] == "beta" for e in chunks)
    assert len({e["id"] for e in chunks}) == 1
    assert "".join(e["choices"][0]["text"] for e in chunks) == "heyhe"
    assert [e["choices"][0]["finish_reason"] for e in chunks] == [None] * 5 + ["length"]


def test_chat_renders_the_template_and_answers_as_the_assistant():
    backend = FakeBackend()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]},
    ]
    template = "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n"
    r = client(backend).post(
        "/v1/chat/completions", json={"model": "alpha", "messages": messages, "max_tokens": len(template)}
    )
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": template}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == len(template)
    assert backend.received[0][1] == template
    assert render_chat([ChatMessage(role="user", content="x")]) == "<|user|>\nx\n<|assistant|>\n"


def test_chat_stream_sends_role_then_deltas_then_finish_and_usage():
    c = client()
    body = {
        "model": "fake-base",
        "messages": [{"role": "user", "content": "yo"}],
        "max_completion_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        events = sse_events(r.read().decode())
    assert events[-1] == "[DONE]"
    first, *middle, last, usage = events[:-1]
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"]["content"] for e in middle) == "<|us"
    assert last["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4


def test_token_id_prompts_are_passed_through():
    backend = FakeBackend()
    r = completion(client(backend), prompt=[104, 105], max_tokens=3)
    assert r.json()["choices"][0]["text"] == "hih"
    assert r.json()["usage"]["prompt_tokens"] == 2
    assert backend.received[0][1] == [104, 105]


# ----------------------------------------------------------------------------------------------- stop strings
def test_stop_string_cuts_the_text_and_finishes_with_stop():
    r = completion(client(), prompt="hello world", max_tokens=11, stop=["xyz", "o w"])
    body = r.json()
    assert body["choices"][0]["text"] == "hell"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 7  # the tokens generated up to the end of the stop string


def test_stop_string_spanning_tokens_never_leaks_in_a_stream():
    c = client()
    with c.stream(
        "POST",
        "/v1/completions",
        json={"model": "fake-base", "prompt": "abcabd", "max_tokens": 6, "stop": "abd", "stream": True},
    ) as r:
        events = sse_events(r.read().decode())[:-1]
    pieces = [e["choices"][0]["text"] for e in events]
    assert "".join(pieces) == "abc"
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_stop_matcher_holds_back_a_possible_prefix_and_flushes_it_at_the_end():
    m = StopMatcher(["</s>"])
    assert m.feed("ab<") == ("ab", False)
    assert m.feed("/") == ("", False)
    assert m.feed("x") == ("</x", False)
    assert m.feed("</") == ("", False)
    assert m.flush() == "</"
    m = StopMatcher(["\n\n", "END"])
    assert m.feed("a\n") == ("a", False)
    assert m.feed("\nb") == ("", True)


# ------------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unknown_model_is_404_naming_it_and_v1_models(path):
    body = {"model": "gamma", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}
    error = assert_error(client().post(path, json=body), 404)
    assert "'gamma'" in error["message"] and "/v1/models" in error["message"]
    assert error["param"] == "model" and error["code"] == "model_not_found"


def test_adapter_the_backend_rejects_is_404_too():
    backend = FakeBackend()
    backend.adapter_names = lambda: ["alpha", "ghost"]  # listed, but the engine no longer has it
    error = assert_error(completion(client(backend), model="ghost", prompt="x"), 404)
    assert "ghost" in error["message"] and "/v1/models" in error["message"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "temperature": -0.5}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": "x", "n": 3}, "n"),
        ({"prompt": "x", "stop": ["ok", ""]}, "stop"),
        ({"prompt": "x", "model": None}, "model"),
    ],
)
def test_malformed_completion_is_422_naming_the_field(body, field):
    error = assert_error(completion(client(), **body), 422)
    assert error["param"].startswith(field) and field in error["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"model": "alpha", "messages": []},
        {"model": "alpha", "messages": [{"role": "wizard", "content": "x"}]},
        {"model": "alpha", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}]},
        {"model": "alpha", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
    ],
)
def test_malformed_chat_is_422(body):
    assert_error(client().post("/v1/chat/completions", json=body), 422)


def test_body_that_is_not_json_is_422():
    r = client().post("/v1/completions", content=b"{oops", headers={"content-type": "application/json"})
    assert_error(r, 422)


def test_unknown_route_is_an_openai_error():
    assert_error(client().get("/v1/nothing"), 404)


def test_backend_error_is_500_and_the_server_keeps_serving():
    backend = FakeBackend(fail_marker="BOOM")
    c = client(backend)
    error = assert_error(completion(c, prompt="BOOM please"), 500)
    assert "fake backend failure" in error["message"] and error["type"] == "server_error"
    assert completion(c, prompt="ok", max_tokens=2).json()["choices"][0]["text"] == "ok"
    assert c.app.state.openai.in_flight == 0


def test_user_error_raised_by_the_backend_is_400():
    class Refusing(FakeBackend):
        async def generate(self, prompt, adapter, params, request_id) -> AsyncIterator[GenerationChunk]:
            raise ServeError("prompt is longer than the model's context (4096 tokens)")
            yield  # pragma: no cover

    error = assert_error(completion(client(Refusing()), prompt="x"), 400)
    assert "4096" in error["message"]


class FailsMidway(FakeBackend):
    """Sends one chunk, then fails."""

    async def generate(self, prompt, adapter, params, request_id) -> AsyncIterator[GenerationChunk]:
        yield GenerationChunk(request_id, 120, "x", prompt_tokens=1, completion_tokens=1)
        raise RuntimeError("CUDA error: device-side assert")


def test_failure_mid_stream_is_reported_in_band_then_done():
    c = client(FailsMidway())
    with c.stream("POST", "/v1/completions", json={"model": "fake-base", "prompt": "x", "stream": True}) as r:
        events = sse_events(r.read().decode())
    assert events[0]["choices"][0]["text"] == "x"
    assert "CUDA error" in events[1]["error"]["message"]
    assert events[-1] == "[DONE]"
    assert c.app.state.openai.in_flight == 0


def test_failure_mid_generation_without_stream_is_500():
    error = assert_error(completion(client(FailsMidway()), prompt="x"), 500)
    assert "CUDA error" in error["message"]


async def _concurrently(app, first: dict, second: dict) -> tuple[httpx.Response, httpx.Response]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        slow = asyncio.create_task(c.post("/v1/completions", json=first))
        await asyncio.sleep(0.05)
        refused = await c.post("/v1/completions", json=second)
        return await slow, refused


@pytest.mark.parametrize("backend, limit", [(FakeBackend(delay=0.02, max_queue=1), None), (FakeBackend(delay=0.02), 1)])
def test_overload_is_429_with_retry_after(backend, limit):
    app = create_app(backend, max_concurrent=limit)
    body = {"model": "alpha", "prompt": "slow", "max_tokens": 10}
    slow, refused = asyncio.run(_concurrently(app, body, body))
    assert slow.status_code == 200
    error = assert_error(refused, 429)
    assert refused.headers["retry-after"] == "1" and error["code"] == "overloaded"
    assert app.state.openai.in_flight == 0
    assert completion(client(backend, max_concurrent=limit), prompt="x", max_tokens=1).status_code == 200


def test_max_concurrent_must_be_positive():
    with pytest.raises(ServeError, match="max_concurrent"):
        create_app(FakeBackend(), max_concurrent=0)


# ------------------------------------------------------------------------------------------------ cancellation
async def _call_then_disconnect(app, body: dict, after_bodies: int) -> list[dict]:
    """Drive the ASGI app directly: the client disconnects after ``after_bodies`` body messages."""
    sent: list[dict] = []
    gone = asyncio.Event()
    if after_bodies == 0:
        gone.set()
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if sum(m["type"] == "http.response.body" for m in sent) >= after_bodies:
            gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    return sent


@pytest.mark.parametrize("stream, after, delay", [(True, 2, 0.01), (False, 0, 0.01), (True, 0, 60), (False, 0, 60)])
def test_client_disconnect_cancels_the_generation(stream, after, delay):
    """Mid-stream, mid-generation, and while waiting for the first token (delay 60 s: a queued request)."""
    backend = FakeBackend(delay=delay)
    app = create_app(backend)
    body = {"model": "alpha", "prompt": "long", "max_tokens": 10_000, "stream": stream}
    asyncio.run(_call_then_disconnect(app, body, after))
    assert len(backend.cancelled) == 1 and backend.finished == [] and backend.running == {}
    assert app.state.openai.in_flight == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_socket_stream_and_disconnect_with_uvicorn():
    backend = FakeBackend(delay=0.005)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(backend), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        url = f"http://127.0.0.1:{port}/v1/completions"
        whole = httpx.post(url, json={"model": "alpha", "prompt": "ab", "max_tokens": 3}, timeout=5)
        assert whole.json()["choices"][0]["text"] == "aba"
        with httpx.stream(
            "POST", url, json={"model": "alpha", "prompt": "ab", "max_tokens": 100_000, "stream": True}, timeout=5
        ) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
        while not backend.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(backend.cancelled) == 1 and backend.running == {}
    finally:
        server.should_exit = True
        thread.join(timeout=5)


class HalfCharacters(FakeBackend):
    """Generates "é" as its two UTF-8 halves (the first decodes to no text), then an end-of-sequence token."""

    async def generate(self, prompt, adapter, params, request_id) -> AsyncIterator[GenerationChunk]:
        for k, (token, text, reason) in enumerate([(195, "", None), (169, "é", None), (2, "", "stop")], 1):
            yield GenerationChunk(request_id, token, text, reason, prompt_tokens=1, completion_tokens=k)


def test_completion_stream_sends_every_token_id_also_without_text():
    c = client(HalfCharacters())
    with c.stream("POST", "/v1/completions", json={"model": "fake-base", "prompt": "x", "stream": True}) as r:
        chunks = [e for e in sse_events(r.read().decode()) if e != "[DONE]"]
    choices = [e["choices"][0] for e in chunks]
    assert [ch.get("token_ids") for ch in choices] == [[195], [169], [2], None]  # the last: the finish event
    assert [ch["text"] for ch in choices] == ["", "é", "", ""]
    assert choices[-1]["finish_reason"] == "stop"
    whole = completion(c, prompt="x").json()["choices"][0]
    assert whole["text"] == "é" and "token_ids" not in whole  # the extension is in streamed chunks only


def test_chat_stream_sends_only_deltas_with_text():
    c = client(HalfCharacters())
    body = {"model": "fake-base", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [e for e in sse_events(r.read().decode()) if e != "[DONE]"]
    contents = [e["choices"][0]["delta"].get("content") for e in chunks]
    assert contents == ["", "é", None]  # the role event, the one delta with text, the finish event
