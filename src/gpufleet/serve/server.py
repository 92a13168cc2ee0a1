"""OpenAI-compatible HTTP front end (FastAPI): /v1/models, /v1/completions and /v1/chat/completions.

The server turns requests into ``GenerationBackend.generate`` calls (an engine, or ``PlacementFrontend`` over
several). It owns what is text-level: the chat template, stop strings (cut exactly, even when a stop string spans
tokens) and the OpenAI wire format. Every failure becomes OpenAI error JSON; the server never goes down with one.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from gpufleet.errors import ServeError
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

log = logging.getLogger(__name__)

RETRY_AFTER_S = "1"
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


def backend_error(exc: BaseException) -> ApiError:
    """Map what the backend raised to an HTTP error: 404 unknown adapter, 429 overload, 400 bad request, 500."""
    if isinstance(exc, ApiError):
        return exc
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


def _install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    async def on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return ApiError(422, message, param=param, code="invalid_value").response()

    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return ApiError(exc.status_code, str(exc.detail), headers=exc.headers).response()

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
    ) -> None:
        self._chunks, self._first, self._release = chunks, first, release
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
    """Routes' state: the backend, the served names and the in-flight count."""

    def __init__(self, backend: GenerationBackend, model_name: str | None, max_concurrent: int | None) -> None:
        if max_concurrent is not None and max_concurrent < 1:
            raise ServeError(f"max_concurrent must be at least 1 (got {max_concurrent}); leave it unset for no limit")
        self.backend = backend
        self.base_names = {backend.base_model_name()} | ({model_name} if model_name else set())
        self.model_name = model_name or backend.base_model_name()
        self.max_concurrent = max_concurrent
        self.in_flight = 0
        self.created = int(time.time())

    def models(self) -> ModelList:
        """The base model, then every adapter with the base as parent."""
        cards = [ModelCard(id=self.model_name, created=self.created)]
        cards += [
            ModelCard(id=name, created=self.created, parent=self.model_name)
            for name in sorted(self.backend.adapter_names())
        ]
        return ModelList(data=cards)

    def resolve(self, model: str) -> str | None:
        """The adapter a model name asks for (None for the base model); 404 for a name that is neither."""
        if model in self.base_names:
            return None
        if model in self.backend.adapter_names():
            return model
        raise ApiError(
            404,
            f"The model or adapter '{model}' does not exist here. GET /v1/models lists the base "
            f"model and every adapter served.",
            param="model",
            code="model_not_found",
        )

    async def start(
        self,
        request: Request,
        model: str,
        prompt: str | list[int],
        params: SamplingParams,
        stops: Sequence[str],
        request_id: str,
    ) -> Generation:
        """Admit the request and wait for its first chunk (a disconnect meanwhile cancels it); backend refusals
        (unknown adapter, overload) surface here as ApiError."""
        adapter = self.resolve(model)
        if self.max_concurrent is not None and self.in_flight >= self.max_concurrent:
            raise overloaded(f"the server is at its limit of {self.max_concurrent} requests in flight; retry shortly")
        self.in_flight += 1
        chunks: AsyncIterator[GenerationChunk] | None = None
        try:
            chunks = stream = aiter(self.backend.generate(prompt, adapter, params, request_id))
            first = await unless_disconnected(request, lambda: anext(stream, None))
        except Exception as exc:
            self.in_flight -= 1
            if chunks is not None:
                await _close_quietly(chunks)
            raise backend_error(exc) from exc
        return Generation(stream, first, stops, self._release)

    def _release(self) -> None:
        self.in_flight -= 1


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
) -> Any:
    """Start the generation, then stream it as SSE or answer with the whole output."""
    params = body.sampling_params(max_tokens)
    gen = await server.start(request, body.model, prompt, params, body.stop_strings(), shape.id)
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


def create_app(
    backend: GenerationBackend, *, model_name: str | None = None, max_concurrent: int | None = None
) -> FastAPI:
    """The OpenAI-compatible app over ``backend``.

    ``model_name`` is the name the base model is listed under (default: the backend's own, which is accepted
    too); ``max_concurrent`` bounds the requests in flight (more get 429 with Retry-After; default: no bound).
    """
    server = OpenAIServer(backend, model_name, max_concurrent)
    app = FastAPI(title="gpufleet OpenAI-compatible LoRA server", version="1")
    app.state.openai = server
    _install_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "in_flight": server.in_flight}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return server.models().model_dump()

    @app.get("/v1/state")
    async def backend_state() -> Any:
        """The backend's ``state()`` (batch, KV blocks ...) for a placement front end; 404 if it reports none."""
        report = getattr(server.backend, "state", None)
        if not callable(report):
            raise ApiError(404, "this backend reports no state", code="no_state")
        return jsonable_encoder(await anyio.to_thread.run_sync(report))  # state() may wait on the engine's lock

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        shape = CompletionShape(f"cmpl-{uuid.uuid4().hex}", body.model)
        return await _respond(server, shape, body, body.prompt, body.max_tokens, request)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        shape = ChatShape(f"chatcmpl-{uuid.uuid4().hex}", body.model)
        return await _respond(server, shape, body, render_chat(body.messages), body.token_budget(), request)

    return app


def run_server(
    backend: GenerationBackend,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    model_name: str | None = None,
    max_concurrent: int | None = None,
    log_level: str = "info",
) -> None:
    """Serve ``backend`` over HTTP with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(
        create_app(backend, model_name=model_name, max_concurrent=max_concurrent),
        host=host,
        port=port,
        log_level=log_level,
    )
