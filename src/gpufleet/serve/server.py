"""OpenAI-compatible HTTP front end (FastAPI): /v1/models, /v1/completions and /v1/chat/completions.

The server turns requests into ``GenerationBackend.generate`` calls (an engine, or ``PlacementFrontend`` over
several). It owns what is text-level: the chat template, stop strings (cut exactly, even when a stop string spans
tokens) and the OpenAI wire format. Every failure becomes OpenAI error JSON; the server never goes down with one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from gpufleet.errors import ServeError
from gpufleet.serve.adapter_paths import AdapterPathError, check_adapter_name, resolve_adapter_path
from gpufleet.serve.fairness import FairQueue, RateLimiter, TenantLimitError
from gpufleet.serve.metrics import NO_ADAPTER, UNAUTHENTICATED, ServeMetrics
from gpufleet.serve.openai_schema import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Delta,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    Usage,
)
from gpufleet.serve.protocol import (
    GenerationBackend,
    GenerationChunk,
    OverloadedError,
    SamplingParams,
    UnknownAdapterError,
)
from gpufleet.serve.tenants import Tenant, TenantRegistry, anonymous_tenant

log = logging.getLogger(__name__)

RETRY_AFTER_S = "1"
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
T = TypeVar("T")


# ------------------------------------------------------------------------------------------- chat template
def render_chat(messages: Sequence[ChatMessage]) -> str:
    """The chat template: one ``<|role|>\\ncontent\\n`` block per message, then ``<|assistant|>\\n``.

    For example [system "Be brief.", user "Hi"] becomes ``"<|system|>\\nBe brief.\\n<|user|>\\nHi\\n<|assistant|>\\n"``.
    It is the template of Zephyr/TinyLlama-chat without the end-of-turn tokens, which vary between tokenizers.
    """
    return "".join(f"<|{m.role}|>\n{m.text()}\n" for m in messages) + "<|assistant|>\n"


# -------------------------------------------------------------------------------------------- stop strings
class StopMatcher:
    """Cuts streamed text at the first stop string; holds back a tail that could be the start of one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add ``text``; return what is safe to emit and whether a stop string was reached (then emit no more)."""
        buf = self._held + text
        cuts = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self._held = ""
            return buf[: min(cuts)], True
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """The held-back tail, once the output has ended without a stop string."""
        held, self._held = self._held, ""
        return held

    def _partial_tail(self, buf: str) -> int:
        longest = max((len(s) for s in self.stops), default=1) - 1
        for k in range(min(longest, len(buf)), 0, -1):
            if any(s.startswith(buf[-k:]) for s in self.stops):
                return k
        return 0


# -------------------------------------------------------------------------------------------------- errors
class ApiError(Exception):
    """An error answered as OpenAI error JSON with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> ErrorResponse:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code))

    def response(self) -> JSONResponse:
        """The JSON response of this error."""
        return JSONResponse(self.body().model_dump(), status_code=self.status, headers=self.headers)


def overloaded(message: str) -> ApiError:
    """429 with Retry-After: the client should come back shortly."""
    return ApiError(429, message, type="rate_limit_error", code="overloaded", headers={"Retry-After": RETRY_AFTER_S})


def tenant_limited(exc: TenantLimitError) -> ApiError:
    """429 for one tenant over its own limit, with Retry-After in whole seconds (at least 1)."""
    retry = str(max(1, math.ceil(exc.retry_after_s)))
    return ApiError(429, str(exc), type="rate_limit_error", code=exc.reason, headers={"Retry-After": retry})


def backend_error(exc: BaseException) -> ApiError:
    """Map what the backend raised to an HTTP error: 404 unknown adapter, 429 overload, 400 bad request, 500."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, TenantLimitError):
        return tenant_limited(exc)
    if isinstance(exc, UnknownAdapterError):
        return ApiError(
            404,
            f"{exc} GET /v1/models lists the models and adapters served here.",
            param="model",
            code="model_not_found",
        )
    if isinstance(exc, OverloadedError):
        return overloaded(str(exc))
    if isinstance(exc, ServeError):
        return ApiError(400, str(exc))
    log.error("generation backend failed", exc_info=exc)
    return ApiError(
        500, f"the generation backend failed: {type(exc).__name__}: {exc}", type="server_error", code="backend_error"
    )


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One line naming each bad field, and the first field's name as ``param``."""
    parts, params = [], []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        field = ".".join(loc) or "body"
        params.append(field)
        parts.append(f"{field}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts), (params[0] if params else None)


def _install_error_handlers(app: FastAPI, record: Callable[[Request, ApiError], None]) -> None:
    """Every error becomes OpenAI error JSON; ``record`` counts it (the metrics)."""

    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        record(request, exc)
        return exc.response()

    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        error = ApiError(422, message, param=param, code="invalid_value")
        record(request, error)
        return error.response()

    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = ApiError(exc.status_code, str(exc.detail), headers=exc.headers)
        record(request, error)
        return error.response()

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


# ---------------------------------------------------------------------------------------------- generation
class Generation:
    """One request's backend stream: stop strings applied, tokens counted, closed exactly once."""

    def __init__(
        self,
        chunks: AsyncIterator[GenerationChunk],
        first: GenerationChunk | None,
        stops: Sequence[str],
        release: Callable[[], None],
        on_chunk: Callable[[], None] | None = None,
    ) -> None:
        self._chunks, self._first, self._release, self._on_chunk = chunks, first, release, on_chunk
        self._stop = StopMatcher(stops)
        self.finish_reason: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._closed = False

    async def steps(self) -> AsyncIterator[tuple[str, int | None]]:
        """Per generated token, (the text it releases, its id); ``finish_reason`` and the counts are set at the end.

        The text may be empty: an end-of-sequence token, part of a UTF-8 character, text a stop string may still
        claim. Text held back to the end comes last, with id None.
        """
        chunk = self._first
        while chunk is not None:
            self._count(chunk)
            text, hit = self._stop.feed(chunk.text)
            yield text, chunk.token_id
            if hit:
                self.finish_reason = "stop"
                return
            if chunk.finish_reason is not None:
                break
            chunk = await anext(self._chunks, None)
        self.finish_reason = chunk.finish_reason if chunk is not None else "stop"
        tail = self._stop.flush()
        if tail:
            yield tail, None

    async def pieces(self) -> AsyncIterator[str]:
        """The output text, piece by piece (no empty pieces); ``finish_reason`` and the counts are set at the end."""
        async with contextlib.aclosing(self.steps()) as steps:
            async for text, _ in steps:
                if text:
                    yield text

    def usage(self) -> Usage:
        """Token counts so far (final once ``pieces`` has ended)."""
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
        )

    async def aclose(self) -> None:
        """Close the backend stream (the engine aborts the request if it is still running) and free the slot."""
        if self._closed:
            return
        self._closed = True
        try:
            await _close_quietly(self._chunks)
        finally:
            self._release()

    def _count(self, chunk: GenerationChunk) -> None:
        if self._on_chunk is not None:
            self._on_chunk()
        self.prompt_tokens = max(self.prompt_tokens, chunk.prompt_tokens)
        self.completion_tokens = chunk.completion_tokens or self.completion_tokens + 1


class CancellingStreamingResponse(StreamingResponse):
    """A streaming response that stops the generation as soon as the client disconnects.

    It always listens for ``http.disconnect`` (Starlette does so only for old ASGI spec versions) and always
    closes the body iterator, whose ``finally`` closes the backend stream, so the engine frees the request.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._stream_then_cancel, send, group.cancel_scope)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
        if self.background is not None:
            await self.background()

    async def _stream_then_cancel(self, send: Send, scope: anyio.CancelScope) -> None:
        with contextlib.suppress(OSError):  # the client went away mid-write
            await self.stream_response(send)
        scope.cancel()


# ------------------------------------------------------------------------------------------------ the app
class OpenAIServer:
    """Routes' state: the backend, the served names, the tenants and their limits, the queue and the metrics.

    Without ``tenants`` every client is one anonymous admin tenant with no limits (the CLI then binds to
    127.0.0.1 only). ``max_concurrent`` bounds the requests in flight (admitted, waiting or running: more get
    429 "overloaded"); ``max_running`` bounds those passed to the backend, the others wait in the fair queue
    (``FairQueue``), at most ``max_waiting`` of them. ``adapters_root`` is where ``POST /v1/adapters`` may load from.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        model_name: str | None,
        max_concurrent: int | None,
        *,
        tenants: TenantRegistry | None = None,
        adapters_root: str | Path | None = None,
        max_running: int | None = None,
        max_waiting: int | None = None,
        max_label_values: int = 64,
    ) -> None:
        for name, value in (("max_concurrent", max_concurrent), ("max_running", max_running)):
            if value is not None and value < 1:
                raise ServeError(f"{name} must be at least 1 (got {value}); leave it unset for no limit")
        self.backend = backend
        self.base_names = {backend.base_model_name()} | ({model_name} if model_name else set())
        self.model_name = model_name or backend.base_model_name()
        self.max_concurrent = max_concurrent
        self.in_flight = 0
        self.created = int(time.time())
        self.tenants = tenants
        self.anonymous = anonymous_tenant()
        self.adapters_root = None if adapters_root is None else Path(adapters_root)
        self.limiter = RateLimiter()
        self.queue = FairQueue(max_running, max_waiting, tenants.queue_share if tenants else 1.0)
        self.metrics = ServeMetrics(self.backend_state, self.queue_sizes, max_label_values)
        self.adapter_use: Counter[str] = Counter()  # requests in flight per adapter (waiting or running)
        self.unloading: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------------------------------ auth
    def authenticate(self, request: Request) -> Tenant:
        """The tenant of the request's ``Authorization: Bearer`` key; 401 without one or with a wrong one."""
        if self.tenants is None:
            request.state.tenant = self.anonymous.name
            return self.anonymous
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if not header or scheme.lower() != "bearer" or not key.strip():
            raise ApiError(
                401,
                "no API key: send 'Authorization: Bearer <key>' (OpenAI clients: api_key=...)",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        tenant = self.tenants.authenticate(key.strip())
        if tenant is None:
            raise ApiError(
                401, "the API key is not valid here", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
            )
        request.state.tenant = tenant.name
        return tenant

    def authenticate_admin(self, request: Request) -> Tenant:
        """Like ``authenticate``, then 403 unless the tenant is an admin."""
        tenant = self.authenticate(request)
        if not tenant.admin:
            raise ApiError(
                403,
                f"tenant '{tenant.name}' is not an admin; this endpoint needs a key with admin = true",
                type="permission_error",
                code="admin_only",
            )
        return tenant

    # ---------------------------------------------------------------------------------------------- models
    def served_adapters(self) -> list[str]:
        """Adapters the backend serves, less those being unloaded."""
        return sorted(set(self.backend.adapter_names()) - self.unloading)

    def models(self, tenant: Tenant | None = None) -> ModelList:
        """The base model, then every adapter with the base as parent; only what ``tenant`` may use."""
        tenant = tenant or self.anonymous
        cards = [ModelCard(id=self.model_name, created=self.created)] if tenant.may_use(None) else []
        cards += [
            ModelCard(id=name, created=self.created, parent=self.model_name)
            for name in self.served_adapters()
            if tenant.may_use(name)
        ]
        return ModelList(data=cards)

    def resolve(self, model: str, tenant: Tenant | None = None) -> str | None:
        """The adapter a model name asks for (None for the base model); 403 outside the tenant's list, else 404
        for a name that is neither (the permission is checked first, so a refusal reveals nothing)."""
        tenant = tenant or self.anonymous
        adapter = None if model in self.base_names else model
        if not tenant.may_use(adapter):
            what = "the base model" if adapter is None else f"the adapter '{model}'"
            raise ApiError(
                403,
                f"tenant '{tenant.name}' may not use {what}; GET /v1/models lists what this key may use",
                type="permission_error",
                param="model",
                code="model_not_allowed",
            )
        if adapter is None or adapter in self.served_adapters():
            return adapter
        raise ApiError(
            404,
            f"The model or adapter '{model}' does not exist here. GET /v1/models lists the base "
            f"model and every adapter served.",
            param="model",
            code="model_not_found",
        )

    # ------------------------------------------------------------------------------------------ generation
    def count_prompt(self, prompt: str | list[int]) -> int:
        """Prompt tokens for the rate limit: the backend's count where it has one, else about 4 bytes a token."""
        if not isinstance(prompt, str):
            return len(prompt)
        count = getattr(self.backend, "count_tokens", None)
        if callable(count):
            try:
                return int(count(prompt))
            except Exception:  # a counting failure must not refuse the request
                log.debug("count_tokens failed", exc_info=True)
        return len(prompt.encode()) // 4 + 1

    async def start(
        self,
        request: Request,
        model: str,
        prompt: str | list[int],
        params: SamplingParams,
        stops: Sequence[str],
        request_id: str,
        tenant: Tenant | None = None,
    ) -> Generation:
        """Admit the request (tenant's access, rate and queue share), wait for a place in the backend and for its
        first chunk (a disconnect meanwhile cancels it); refusals surface here as ApiError."""
        tenant = tenant or self.anonymous
        arrival = time.monotonic()
        adapter = self.resolve(model, tenant)
        request.state.adapter = adapter
        if self.max_concurrent is not None and self.in_flight >= self.max_concurrent:
            raise overloaded(f"the server is at its limit of {self.max_concurrent} requests in flight; retry shortly")
        charged = self.count_prompt(prompt) + params.max_tokens
        try:
            self.limiter.admit(tenant, charged)
        except TenantLimitError as exc:
            raise tenant_limited(exc) from exc
        self.in_flight += 1
        self.adapter_use[adapter or ""] += 1
        placed = False
        chunks: AsyncIterator[GenerationChunk] | None = None
        labels = self.metrics.labels(tenant.name, adapter)
        try:
            await unless_disconnected(request, lambda: self.queue.acquire(tenant))
            placed = True
            chunks = stream = aiter(self.backend.generate(prompt, adapter, params, request_id))
            first = await unless_disconnected(request, lambda: anext(stream, None))
            first_at = time.monotonic()
        except BaseException as exc:
            if chunks is not None:
                await _close_quietly(chunks)
            self._finish(tenant, adapter, placed, charged, 0)
            if isinstance(exc, Exception):
                raise backend_error(exc) from exc
            raise
        last = [arrival]

        def on_chunk() -> None:  # the first chunk's time is when it arrived, not when the response got to it
            now = first_at if last[0] == arrival else time.monotonic()
            (self.metrics.ttft if last[0] == arrival else self.metrics.itl).labels(*labels).observe(now - last[0])
            last[0] = now

        gen: Generation

        def release() -> None:
            self._finish(tenant, adapter, True, charged, gen.prompt_tokens + gen.completion_tokens)
            self.metrics.prompt_tokens.labels(*labels).inc(gen.prompt_tokens)
            self.metrics.generation_tokens.labels(*labels).inc(gen.completion_tokens)
            if gen.finish_reason is not None:
                self.metrics.requests.labels(*labels, "200").inc()

        gen = Generation(stream, first, stops, release, on_chunk)
        return gen

    def _finish(self, tenant: Tenant, adapter: str | None, placed: bool, charged: int, used: int) -> None:
        """A request is over (or was refused after admission): free its places, settle its tokens, and unload its
        adapter if that was waiting for it."""
        self.in_flight -= 1
        if placed:
            self.queue.release(tenant)
        self.limiter.refund(tenant, charged - used)
        key = adapter or ""
        self.adapter_use[key] -= 1
        if self.adapter_use[key] <= 0:
            del self.adapter_use[key]
            if adapter in self.unloading:
                self._spawn(self._unload_now(adapter))

    # -------------------------------------------------------------------------------------------- adapters
    async def load_adapter(self, name: str, path: str) -> dict[str, Any]:
        """``POST /v1/adapters``: check the name and the path, then load the folder into the backend."""
        load = getattr(self.backend, "load_adapter", None)
        if not callable(load):
            raise ApiError(501, "this backend cannot load adapters at runtime", type="server_error", code="unsupported")
        if self.adapters_root is None:
            raise ApiError(
                400,
                "this server was started without --adapters, so it has no folder to load adapters from; restart it "
                "with --adapters DIR",
                param="path",
                code="no_adapters_root",
            )
        try:
            check_adapter_name(name)
        except AdapterPathError as exc:
            raise ApiError(400, str(exc), param="name", code="bad_adapter_name") from exc
        try:
            folder = resolve_adapter_path(self.adapters_root, path)
        except AdapterPathError as exc:
            raise ApiError(400, str(exc), param="path", code="bad_adapter_path") from exc
        if name in self.base_names or name in self.backend.adapter_names() or name in self.unloading:
            state = "is being unloaded" if name in self.unloading else "is already served"
            raise ApiError(409, f"'{name}' {state}; DELETE it first or choose another name", code="adapter_exists")
        try:
            await load(name, folder)
        except ServeError as exc:
            raise ApiError(400, str(exc), param="path", code="bad_adapter") from exc
        log.info("loaded adapter %s from %s", name, folder)
        return {"name": name, "path": str(folder.relative_to(self.adapters_root.resolve())), "status": "loaded"}

    async def unload_adapter(self, name: str) -> tuple[int, dict[str, Any]]:
        """``DELETE /v1/adapters/{name}``: new requests get 404 at once; the backend unloads it once the requests
        in flight for it have finished (200 when that is now, else 202 with their number)."""
        if not callable(getattr(self.backend, "unload_adapter", None)):
            raise ApiError(501, "this backend cannot unload adapters", type="server_error", code="unsupported")
        if name not in self.backend.adapter_names() or name in self.unloading:
            raise ApiError(404, f"no adapter '{name}' is served here (GET /v1/models)", code="model_not_found")
        self.unloading.add(name)
        in_flight = self.adapter_use.get(name, 0)
        if in_flight:
            return 202, {"name": name, "status": "unloading", "in_flight": in_flight}
        await self._unload_now(name)
        return 200, {"name": name, "status": "unloaded"}

    async def _unload_now(self, name: str) -> None:
        try:
            await self.backend.unload_adapter(name)  # type: ignore[attr-defined]
            log.info("unloaded adapter %s", name)
        except Exception:
            log.error("unloading adapter %s failed", name, exc_info=True)
        finally:
            self.unloading.discard(name)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --------------------------------------------------------------------------------------------- metrics
    def queue_sizes(self) -> tuple[int, int]:
        """(requests passed to the backend, requests waiting in the fair queue)."""
        return self.queue.running, self.queue.waiting

    def backend_state(self) -> Mapping[str, Any] | None:
        """The backend's ``state()`` as a mapping (None when it has none)."""
        report = getattr(self.backend, "state", None)
        if not callable(report):
            return None
        value = report()
        if is_dataclass(value) and not isinstance(value, type):
            free = getattr(value, "free_blocks", None)
            data = {k: v for k, v in asdict(value).items() if isinstance(v, int | float)}
            return {**data, "free_blocks": free, "batch": getattr(value, "batch_size", 0)}
        return value if isinstance(value, Mapping) else None

    def record_error(self, request: Request, error: ApiError) -> None:
        """Count a refused or failed generation request under its tenant and adapter."""
        if request.url.path not in GENERATION_PATHS:
            return
        tenant = getattr(request.state, "tenant", UNAUTHENTICATED)
        adapter = getattr(request.state, "adapter", NO_ADAPTER)
        labels = self.metrics.labels(tenant, adapter)
        self.metrics.requests.labels(*labels, str(error.status)).inc()
        self.metrics.errors.labels(*labels, error.code or error.type).inc()


async def _close_quietly(chunks: AsyncIterator[Any]) -> None:
    """Close a backend stream (even while being cancelled); an error while closing is logged, not raised."""
    close = getattr(chunks, "aclose", None)
    if close is None:
        return
    try:
        with anyio.CancelScope(shield=True):
            await close()
    except Exception:  # the request is over either way; a failure here must not hide its outcome
        log.warning("closing a backend stream raised", exc_info=True)


async def _join(gen: Generation) -> str:
    """The whole output of a non-streamed request."""
    async with contextlib.aclosing(gen.pieces()) as pieces:
        return "".join([piece async for piece in pieces])


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """Await ``work()``; if the client disconnects first, cancel it and raise a 499 ``ApiError``."""
    outcome: dict[str, Any] = {}
    async with anyio.create_task_group() as group:
        group.start_soon(_cancel_on_disconnect, request, group.cancel_scope)
        try:
            outcome["value"] = await work()
        except Exception as exc:  # re-raised outside the task group, unwrapped
            outcome["error"] = exc
        group.cancel_scope.cancel()
    if "error" in outcome:
        raise outcome["error"]
    if "value" not in outcome:
        raise ApiError(499, "the client closed the request", code="client_closed_request")
    return outcome["value"]


async def _cancel_on_disconnect(request: Request, scope: anyio.CancelScope) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def _sse(payload: Any) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


async def _stream_events(
    gen: Generation,
    first: Sequence[Any],
    piece: Callable[[str, int | None], Any],
    last: Callable[[str | None], Any],
    usage: Callable[[Usage], Any] | None,
) -> AsyncIterator[str]:
    """Server-sent events: leading events, one per generated token (``piece`` may skip one: None), the finishing
    one, optional usage, ``[DONE]``."""
    try:
        for event in first:
            yield _sse(event)
        async with contextlib.aclosing(gen.steps()) as steps:
            async for text, token_id in steps:
                event = piece(text, token_id)
                if event is not None:
                    yield _sse(event)
        yield _sse(last(gen.finish_reason))
        if usage is not None:
            yield _sse(usage(gen.usage()))
    except Exception as exc:  # headers are sent: report in-band, as OpenAI does
        yield _sse(backend_error(exc).body())
    finally:
        await gen.aclose()
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------------------------------- response shapes
class CompletionShape:
    """How /v1/completions words its responses and chunks."""

    def __init__(self, request_id: str, model: str) -> None:
        self.id, self.model, self.created = request_id, model, int(time.time())

    def _make(self, choices: list[CompletionChoice], usage: Usage | None = None) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def first(self) -> list[Any]:
        return []

    def piece(self, text: str, token_id: int | None) -> CompletionResponse | None:
        """Every token gets an event with its id (gpufleet's ``token_ids`` extension), text or not."""
        if token_id is None or token_id < 0:
            return self._make([CompletionChoice(text=text)]) if text else None
        return self._make([CompletionChoice(text=text, token_ids=[token_id])])

    def last(self, reason: str | None) -> CompletionResponse:
        return self._make([CompletionChoice(text="", finish_reason=reason)])

    def usage(self, usage: Usage) -> CompletionResponse:
        return self._make([], usage)

    def whole(self, text: str, reason: str | None, usage: Usage) -> CompletionResponse:
        return self._make([CompletionChoice(text=text, finish_reason=reason)], usage)


class ChatShape:
    """How /v1/chat/completions words its responses and chunks (``chat.completion.chunk`` with deltas)."""

    def __init__(self, request_id: str, model: str) -> None:
        self.id, self.model, self.created = request_id, model, int(time.time())

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def first(self) -> list[Any]:
        return [self._chunk([ChatChunkChoice(delta=Delta(role="assistant", content=""))])]

    def piece(self, text: str, token_id: int | None) -> ChatCompletionChunk | None:
        """Only tokens with text: chat deltas carry text, as OpenAI's do."""
        return self._chunk([ChatChunkChoice(delta=Delta(content=text))]) if text else None

    def last(self, reason: str | None) -> ChatCompletionChunk:
        return self._chunk([ChatChunkChoice(delta=Delta(), finish_reason=reason)])

    def usage(self, usage: Usage) -> ChatCompletionChunk:
        return self._chunk([], usage)

    def whole(self, text: str, reason: str | None, usage: Usage) -> ChatCompletionResponse:
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=reason)
        return ChatCompletionResponse(id=self.id, created=self.created, model=self.model, choices=[choice], usage=usage)


async def _respond(
    server: OpenAIServer,
    shape: CompletionShape | ChatShape,
    body: CompletionRequest | ChatCompletionRequest,
    prompt: str | list[int],
    max_tokens: int,
    request: Request,
    tenant: Tenant,
) -> Any:
    """Start the generation, then stream it as SSE or answer with the whole output."""
    params = body.sampling_params(max_tokens)
    gen = await server.start(request, body.model, prompt, params, body.stop_strings(), shape.id, tenant)
    if body.stream:
        events = _stream_events(
            gen, shape.first(), shape.piece, shape.last, shape.usage if body.include_usage() else None
        )
        return CancellingStreamingResponse(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
    try:
        text = await unless_disconnected(request, lambda: _join(gen))
    except ApiError:
        raise
    except Exception as exc:
        raise backend_error(exc) from exc
    finally:
        await gen.aclose()
    return JSONResponse(shape.whole(text, gen.finish_reason, gen.usage()).model_dump())


class OverLimitGate:
    """ASGI middleware: a generation request whose tenant is over its ``requests_per_s`` gets its 429 here, before
    the body is read or validated, so that a flood costs the server as little as possible. Only a check: the
    request is charged (and checked again, with its tokens) in ``OpenAIServer.start``."""

    def __init__(self, app: Any, server: OpenAIServer) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = self.server
        if scope["type"] == "http" and server.tenants is not None and scope.get("path") in GENERATION_PATHS:
            header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
            scheme, _, key = header.partition(" ")
            tenant = server.tenants.authenticate(key.strip()) if scheme.lower() == "bearer" else None
            wait = server.limiter.request_wait(tenant) if tenant is not None else 0.0
            if tenant is not None and wait > 0:
                exc = TenantLimitError(
                    f"tenant '{tenant.name}' is over its requests_per_s limit; retry in {math.ceil(wait)} s",
                    wait,
                    "requests_per_s",
                )
                error = tenant_limited(exc)
                labels = server.metrics.labels(tenant.name, NO_ADAPTER)
                server.metrics.requests.labels(*labels, "429").inc()
                server.metrics.errors.labels(*labels, "requests_per_s").inc()
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class AdapterLoad(BaseModel):
    """``POST /v1/adapters``: the name clients will use, and the PEFT folder relative to the adapters root."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1, max_length=4096)


def create_app(
    backend: GenerationBackend,
    *,
    model_name: str | None = None,
    max_concurrent: int | None = None,
    tenants: TenantRegistry | None = None,
    adapters_root: str | Path | None = None,
    max_running: int | None = None,
    max_waiting: int | None = None,
    max_label_values: int = 64,
) -> FastAPI:
    """The OpenAI-compatible app over ``backend``.

    ``model_name`` is the name the base model is listed under (default: the backend's own, which is accepted
    too); ``max_concurrent`` bounds the requests in flight (more get 429 with Retry-After; default: no bound).
    ``tenants`` (``--api-keys``) turns on keys, per-tenant access, limits and admin endpoints; see
    ``OpenAIServer`` for ``adapters_root``, ``max_running`` and ``max_waiting``.
    """
    server = OpenAIServer(
        backend,
        model_name,
        max_concurrent,
        tenants=tenants,
        adapters_root=adapters_root,
        max_running=max_running,
        max_waiting=max_waiting,
        max_label_values=max_label_values,
    )
    app = FastAPI(title="gpufleet OpenAI-compatible LoRA server", version="1")
    app.state.openai = server
    _install_error_handlers(app, server.record_error)
    app.add_middleware(OverLimitGate, server=server)
    as_tenant = Depends(server.authenticate)  # a default value, not Annotated: the routes' annotations are strings
    as_admin = Depends(server.authenticate_admin)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "in_flight": server.in_flight}

    @app.get("/v1/models")
    async def list_models(tenant: Tenant = as_tenant) -> dict[str, Any]:
        return server.models(tenant).model_dump()

    @app.get("/v1/state")
    async def backend_state(_: Tenant = as_admin) -> Any:
        """The backend's ``state()`` (batch, KV blocks ...) for a placement front end; 404 if it reports none."""
        report = getattr(server.backend, "state", None)
        if not callable(report):
            raise ApiError(404, "this backend reports no state", code="no_state")
        return jsonable_encoder(await anyio.to_thread.run_sync(report))  # state() may wait on the engine's lock

    @app.get("/metrics")
    async def metrics(_: Tenant = as_admin) -> Response:
        """Prometheus text format (the backend's state is read in a thread: it may wait on the engine's lock)."""
        body = await anyio.to_thread.run_sync(server.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/adapters", status_code=201)
    async def load_adapter(body: AdapterLoad, _: Tenant = as_admin) -> dict[str, Any]:
        return await server.load_adapter(body.name, body.path)

    @app.delete("/v1/adapters/{name}")
    async def unload_adapter(name: str, _: Tenant = as_admin) -> JSONResponse:
        status, payload = await server.unload_adapter(name)
        return JSONResponse(payload, status_code=status)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request, tenant: Tenant = as_tenant) -> Any:
        shape = CompletionShape(f"cmpl-{uuid.uuid4().hex}", body.model)
        return await _respond(server, shape, body, body.prompt, body.max_tokens, request, tenant)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request, tenant: Tenant = as_tenant) -> Any:
        shape = ChatShape(f"chatcmpl-{uuid.uuid4().hex}", body.model)
        return await _respond(server, shape, body, render_chat(body.messages), body.token_budget(), request, tenant)

    return app


def run_server(
    backend: GenerationBackend,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    model_name: str | None = None,
    max_concurrent: int | None = None,
    log_level: str = "info",
    **options: Any,
) -> None:
    """Serve ``backend`` over HTTP with uvicorn until interrupted (``options``: see ``create_app``)."""
    import uvicorn

    uvicorn.run(
        create_app(backend, model_name=model_name, max_concurrent=max_concurrent, **options),
        host=host,
        port=port,
        log_level=log_level,
    )
