"""A ``GenerationBackend`` over HTTP: one gpufleet server (an engine process) seen from a placement front end.

``RemoteBackend(base_url)`` lets ``PlacementFrontend`` route to engines in other processes or on other hosts, as
Punica's scheduler routes to its GPU runners:

* ``adapter_names`` / ``base_model_name`` come from ``GET /v1/models``, cached (``refresh()`` reloads them);
* ``generate`` streams ``POST /v1/completions`` (``stream=true``, text or token-id prompts) and yields one
  ``GenerationChunk`` per generated token (see ``_chunks``); 404 raises ``UnknownAdapterError``, 429
  ``OverloadedError``, other 4xx ``ServeError`` (what the request got wrong), before the first chunk; closing the
  stream closes the HTTP response, so the remote server sees the disconnect and its engine aborts the request;
* ``state()`` is a **cached** copy of ``GET /v1/state``. ``PlacementFrontend`` calls ``state()`` synchronously
  before every decision, inside the event loop, so a network round trip there would stall every request. The
  cache is filled by ``refresh()`` (synchronous: call it before serving) and refreshed in the background after
  a chunk arrives once it is older than ``state_ttl_s``. Placement only reads capacity from it (KV blocks, block
  size, max batch), which does not change while a server runs, so a stale copy is harmless.

The OpenAI wire format carries text; gpufleet's server adds each token's id to its streamed chunks
(``token_ids``), which chunks keep, so that a request with a token-id prompt can migrate by recompute. From
another server chunks have ``token_id = -1``. A chunk's ``prompt_tokens`` is the prompt's length as
``count_tokens`` estimates it until the final usage event gives the server's count. Sampling fields the wire
cannot carry (``stop_token_ids``, ``ignore_eos``) are refused rather than dropped silently.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from gpufleet.errors import ServeError
from gpufleet.serve.protocol import GenerationChunk, OverloadedError, SamplingParams, UnknownAdapterError

UNKNOWN_TOKEN = -1  # a token whose id the server did not send (an OpenAI server other than gpufleet's)
DOWN_STATE = {"max_batch": 0, "total_blocks": 0, "free_blocks": 0, "batch": 0, "waiting": 0}


class RemoteBackendError(RuntimeError):
    """The remote server cannot be reached or failed (not the request's fault: the front end answers 500)."""


def _estimate_tokens(text: str) -> int:
    """About four bytes a token: the same guess ``PlacementFrontend`` makes without a tokenizer."""
    return len(text.encode()) // 4 + 1


def _error_message(response_json: Any, fallback: str) -> tuple[str, str | None, str | None]:
    """(message, type, code) of an OpenAI error body, or the fallback when the body is not one."""
    error = response_json.get("error") if isinstance(response_json, dict) else None
    if not isinstance(error, dict):
        return fallback, None, None
    return str(error.get("message") or fallback), error.get("type"), error.get("code")


def map_error(status: int, message: str, code: str | None, where: str) -> Exception:
    """The backend exception for an HTTP error status (or an in-band error's code) from the remote server."""
    if status == 404 or code == "model_not_found":
        return UnknownAdapterError(message)
    if status == 429 or code == "overloaded":
        return OverloadedError(message)
    if 400 <= status < 500:
        return ServeError(message)
    return RemoteBackendError(f"{where}: {message}")


class RemoteBackend:
    """One gpufleet server at ``base_url`` (``http://host:port``) as a ``GenerationBackend`` with ``state()``.

    ``count_tokens`` (text -> token count, e.g. the server's tokenizer loaded locally) sharpens placement's KV
    estimate of text prompts; without it a byte-based guess is used. ``timeout_s`` bounds connecting and each
    non-streamed call; a stream waits as long as the server takes (a queued request may wait long for its first
    token). ``transport`` is for tests (an httpx transport instead of the network).
    """

    def __init__(
        self,
        base_url: str,
        *,
        count_tokens: Callable[[str], int] | None = None,
        timeout_s: float = 10.0,
        state_ttl_s: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._counter = count_tokens
        self._timeout = httpx.Timeout(timeout_s, read=None, pool=None)
        self._transport = transport
        self.state_ttl_s = state_ttl_s
        self._base: str | None = None
        self._adapters: list[str] = []
        self._state: dict[str, Any] | None = None
        self._state_at = 0.0
        self._state_task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self.down_reason: str | None = None

    def __repr__(self) -> str:
        return f"RemoteBackend({self.base_url!r})"

    # ------------------------------------------------------------------------------------------ metadata
    def refresh(self) -> None:
        """Reload the model list and the state, synchronously (before serving, or from a worker thread)."""
        with httpx.Client(base_url=self.base_url, timeout=self._timeout) as client:
            self._set_models(self._get_json(client.get, "/v1/models"))
            self._set_state(self._fetch_state_sync(client))

    async def arefresh(self) -> None:
        """Reload the model list and the state without blocking the event loop."""
        client = self._async_client()
        self._set_models(await self._aget_json(client, "/v1/models"))
        await self._refresh_state()

    def base_model_name(self) -> str:
        """The remote's base model (the model list's entry without a parent); fetched on first use."""
        if self._base is None:
            self.refresh()
        assert self._base is not None
        return self._base

    def adapter_names(self) -> list[str]:
        """The remote's adapters, as last fetched; none while the server is marked down."""
        if self._base is None:
            self.refresh()
        return [] if self.down_reason else list(self._adapters)

    def count_tokens(self, prompt: str) -> int:
        """Tokens of a text prompt: the given counter, else about four bytes a token."""
        return int(self._counter(prompt)) if self._counter is not None else _estimate_tokens(prompt)

    def state(self) -> dict[str, Any]:
        """The cached ``/v1/state`` (see the module docstring); no capacity at all once marked down.

        The first call without a cached copy fetches it synchronously. A server without ``/v1/state`` gives an
        empty mapping, which leaves placement's own view of its capacity unchanged.
        """
        if self.down_reason:
            return dict(DOWN_STATE)
        if self._state is None:
            with httpx.Client(base_url=self.base_url, timeout=self._timeout) as client:
                self._set_state(self._fetch_state_sync(client))
        return dict(self._state or {})

    def mark_down(self, reason: str) -> None:
        """Take the server out of placement for good (its process died): no adapters, no capacity."""
        self.down_reason = reason

    # ------------------------------------------------------------------------------------ runtime adapters
    async def load_adapter(self, name: str, folder: Path) -> None:
        """``POST /v1/adapters`` on the remote (which checks ``folder`` against its own adapters root)."""
        await self._admin("POST", "/v1/adapters", {"name": name, "path": str(folder)})
        self._adapters = sorted({*self._adapters, name})

    async def unload_adapter(self, name: str) -> None:
        """``DELETE /v1/adapters/{name}`` on the remote."""
        await self._admin("DELETE", f"/v1/adapters/{name}", None)
        self._adapters = [a for a in self._adapters if a != name]

    async def _admin(self, method: str, path: str, body: dict[str, Any] | None) -> None:
        if self.down_reason:
            raise RemoteBackendError(f"{self.base_url} is down ({self.down_reason})")
        try:
            response = await self._async_client().request(method, path, json=body)
        except httpx.TransportError as exc:
            raise RemoteBackendError(f"{self.base_url}: {type(exc).__name__}: {exc}") from exc
        await self._raise_for_status(response)

    # ---------------------------------------------------------------------------------------- generation
    async def generate(
        self, prompt: str | list[int], adapter: str | None, params: SamplingParams, request_id: str
    ) -> AsyncIterator[GenerationChunk]:
        """Stream the remote completion as chunks; refusals raise before the first chunk (see the module doc)."""
        if self.down_reason:
            raise RemoteBackendError(f"{self.base_url} is down ({self.down_reason})")
        body = self._request_body(prompt, adapter, params)
        estimate = len(prompt) if isinstance(prompt, list) else self.count_tokens(prompt)
        client = self._async_client()
        try:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                await self._raise_for_status(response)
                async for chunk in self._chunks(response, request_id, estimate):
                    self._maybe_refresh_state()
                    yield chunk
        except httpx.TransportError as exc:
            raise RemoteBackendError(f"{self.base_url}: {type(exc).__name__}: {exc}") from exc

    def _request_body(self, prompt: str | list[int], adapter: str | None, params: SamplingParams) -> dict[str, Any]:
        if params.stop_token_ids or params.ignore_eos:
            raise ServeError(
                "stop_token_ids and ignore_eos cannot be sent to a remote server (the OpenAI "
                "request has no such fields); use stop strings and max_tokens"
            )
        body: dict[str, Any] = {
            "model": adapter if adapter is not None else self.base_model_name(),
            "prompt": list(prompt) if isinstance(prompt, list) else prompt,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        return body

    async def _raise_for_status(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        raw = await response.aread()
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        message, _, code = _error_message(payload, raw.decode(errors="replace")[:200] or response.reason_phrase)
        raise map_error(response.status_code, message, code, self.base_url)

    async def _chunks(
        self, response: httpx.Response, request_id: str, prompt_tokens: int
    ) -> AsyncIterator[GenerationChunk]:
        """Server-sent events -> one chunk per generated token, the last one with the finish reason.

        A gpufleet server sends one event per generated token with its id (``token_ids``, also for a token
        without text), then a finishing event without text, then the usage. Each chunk is held back by one
        event so that the finishing one can ride on the last. Another OpenAI server sends text only, and no
        event for a token without text: its chunks get ``token_id = -1``, and the tokens it sent no event for
        become empty chunks before the last. A consumer that counts chunks (as ``PlacementFrontend`` does) thus
        ends with the server's token count either way.
        """
        held: GenerationChunk | None = None
        sent, reason, usage = 0, None, {}
        async for event in _events(response):
            if "error" in event:
                message, _, code = _error_message(event, "the remote server failed mid-stream")
                raise map_error(500, message, code, self.base_url)
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                reason = choice.get("finish_reason") or reason
                if choice.get("finish_reason") is None:
                    ids = choice.get("token_ids") or [UNKNOWN_TOKEN]
                    for k, token in enumerate(ids):  # the event's text goes with its last token
                        if held is not None:
                            yield held
                        sent += 1
                        text = (choice.get("text") or "") if k == len(ids) - 1 else ""
                        held = GenerationChunk(
                            request_id, int(token), text, None, prompt_tokens=prompt_tokens, completion_tokens=sent
                        )
        if reason is None:
            raise RemoteBackendError(f"{self.base_url}: the stream ended without a finish reason")
        for chunk in _finish(held, request_id, reason, sent, usage, prompt_tokens):
            yield chunk

    # ------------------------------------------------------------------------------------------- plumbing
    def _async_client(self) -> httpx.AsyncClient:
        """One client per event loop (a client cannot move between loops)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(
                base_url=self.base_url, timeout=self._timeout, limits=limits, transport=self._transport
            )
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client and stop a pending state refresh."""
        if self._state_task is not None:
            self._state_task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _set_models(self, payload: Any) -> None:
        cards = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(cards, list):
            raise RemoteBackendError(f"{self.base_url}/v1/models did not return a model list")
        bases = [c["id"] for c in cards if isinstance(c, dict) and c.get("parent") is None]
        if not bases:
            raise RemoteBackendError(f"{self.base_url}/v1/models lists no base model")
        self._base = bases[0]
        self._adapters = sorted(c["id"] for c in cards if isinstance(c, dict) and c.get("parent") is not None)

    def _set_state(self, payload: Mapping[str, Any] | None) -> None:
        self._state = dict(payload or {})
        self._state_at = time.monotonic()

    def _fetch_state_sync(self, client: httpx.Client) -> dict[str, Any]:
        try:
            response = client.get("/v1/state")
        except httpx.TransportError as exc:
            raise RemoteBackendError(f"{self.base_url}: {type(exc).__name__}: {exc}") from exc
        return {} if response.status_code == 404 else self._json(response, "/v1/state")

    def _maybe_refresh_state(self) -> None:
        """Start one background refresh of the cached state when it is older than ``state_ttl_s``."""
        stale = time.monotonic() - self._state_at > self.state_ttl_s
        if stale and (self._state_task is None or self._state_task.done()):
            self._state_task = asyncio.get_running_loop().create_task(self._refresh_state())

    async def _refresh_state(self) -> None:
        self._state_at = time.monotonic()  # one attempt per TTL, even when it fails
        try:
            response = await self._async_client().get("/v1/state")
            if response.status_code == 404:
                self._set_state({})
            elif response.status_code < 400:
                self._set_state(response.json())
        except (httpx.TransportError, ValueError):
            return  # keep the last copy; a dead server shows in its streams

    def _get_json(self, get: Callable[[str], httpx.Response], path: str) -> Any:
        try:
            return self._json(get(path), path)
        except httpx.TransportError as exc:
            raise RemoteBackendError(f"{self.base_url}: {type(exc).__name__}: {exc}") from exc

    async def _aget_json(self, client: httpx.AsyncClient, path: str) -> Any:
        try:
            return self._json(await client.get(path), path)
        except httpx.TransportError as exc:
            raise RemoteBackendError(f"{self.base_url}: {type(exc).__name__}: {exc}") from exc

    def _json(self, response: httpx.Response, path: str) -> Any:
        if response.status_code >= 400:
            raise RemoteBackendError(f"{self.base_url}{path} answered {response.status_code}: {response.text[:200]}")
        try:
            return response.json()
        except ValueError as exc:
            raise RemoteBackendError(f"{self.base_url}{path} did not answer JSON") from exc


def _finish(
    held: GenerationChunk | None, request_id: str, reason: str, sent: int, usage: Mapping[str, Any], prompt_tokens: int
) -> list[GenerationChunk]:
    """The held-back chunk, empty chunks for the tokens without text, the finish reason on the last chunk."""
    prompt = int(usage.get("prompt_tokens", prompt_tokens))
    total = max(int(usage.get("completion_tokens", sent)), sent, 1)
    chunks = [] if held is None else [held]
    chunks += [
        GenerationChunk(request_id, UNKNOWN_TOKEN, "", None, completion_tokens=k) for k in range(sent + 1, total + 1)
    ]
    for chunk in chunks:
        chunk.prompt_tokens = prompt
    chunks[-1].finish_reason = reason
    return chunks


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of ``data:`` lines until ``[DONE]``."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            return
        event = json.loads(payload)
        if isinstance(event, dict):
            yield event
