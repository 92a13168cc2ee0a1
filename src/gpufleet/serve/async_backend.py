"""The engine behind the HTTP server: its loop runs in one background thread, requests stream back through
asyncio queues. Implements :class:`gpufleet.serve.protocol.GenerationBackend`.

New requests and aborts go through an inbox that the engine thread drains before each step, so the event loop
never waits for a step to end (a lock taken from the event loop would stall every client for a step, and could
lose the race for the lock to the engine thread step after step).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gpufleet.serve.continuous_batching import Engine
from gpufleet.serve.protocol import GenerationChunk, SamplingParams


class AsyncEngine:
    """Thread-safe front of an :class:`Engine`: ``generate`` yields chunks as the engine's steps produce them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._inbox: deque[tuple[Any, ...]] = deque()  # ("add", id, ids, adapter, params) | ("abort", id)
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="gpufleet-engine", daemon=True)
        self._thread.start()

    def base_model_name(self) -> str:
        return self.engine.name

    def adapter_names(self) -> list[str]:
        return self.engine.store.names()

    def state(self) -> dict[str, int]:
        with self._lock:
            return self.engine.state()

    def count_tokens(self, prompt: str) -> int:
        """Tokens of a text prompt with the engine's tokenizer (for the server's token rate limit)."""
        return len(self.engine.tokenizer.encode(prompt))

    async def load_adapter(self, name: str, folder: Path) -> None:
        """Read a PEFT folder (in a thread: it reads files) and serve it as ``name`` from the next step on."""
        from gpufleet.serve.adapters import load_peft_adapter

        config = self.engine.model.config
        adapter = await asyncio.to_thread(load_peft_adapter, folder, config, name)
        with self._lock:
            self.engine.add_adapter(adapter)

    async def unload_adapter(self, name: str) -> None:
        """Stop serving ``name`` (the server calls this once no request for it is in flight)."""
        with self._lock:
            self._drain_inbox()  # the aborts of the requests that used it
            self.engine.remove_adapter(name)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)

    async def generate(
        self, prompt: str | list[int], adapter: str | None, params: SamplingParams, request_id: str
    ) -> AsyncIterator[GenerationChunk]:
        """Queue the request (refusals raise here, before the first chunk) and stream its chunks."""
        ids = self.engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), queue)
        self._inbox.append(("add", request_id, ids, adapter, params))
        self._wake.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True  # refused or failed: the engine holds nothing of it
                    raise item
                finished = item.finish_reason is not None
                yield item
                if finished:
                    return
        finally:
            if not finished:  # the client went away or the consumer stopped early
                self._streams.pop(request_id, None)
                self._inbox.append(("abort", request_id))
                self._wake.set()

    def _drain_inbox(self) -> None:
        """Apply queued additions and aborts (call with the lock held); a refusal goes to its stream."""
        while self._inbox:
            op, request_id, *args = self._inbox.popleft()
            if op == "abort":
                self.engine.abort(request_id)
                continue
            if request_id not in self._streams:  # its stream is gone (client left, or a failure reached it)
                continue
            try:
                self.engine.add_request(request_id, *args)
            except Exception as exc:
                target = self._streams.pop(request_id, None)
                if target is not None:
                    target[0].call_soon_threadsafe(target[1].put_nowait, exc)

    def _loop(self) -> None:
        while not self._stop:
            with self._lock:
                self._drain_inbox()
                busy = self.engine.has_work()
                try:
                    chunks = self.engine.step() if busy else []
                except Exception as exc:  # report to every waiting request; the loop goes on
                    self._fail_all(exc)
                    chunks = []
            for chunk in chunks:
                self._deliver(chunk)
            if not busy:
                self._wake.wait(timeout=0.05)
                self._wake.clear()

    def _deliver(self, chunk: GenerationChunk) -> None:
        target = self._streams.get(chunk.request_id)
        if target is None:
            return
        loop, queue = target
        if chunk.finish_reason is not None:
            self._streams.pop(chunk.request_id, None)
        loop.call_soon_threadsafe(queue.put_nowait, chunk)

    def _fail_all(self, exc: BaseException) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)
        streams, self._streams = self._streams, {}
        for loop, queue in streams.values():
            loop.call_soon_threadsafe(queue.put_nowait, exc)


def build_async_engine(**kwargs: Any) -> AsyncEngine:
    """Convenience for the CLI: ``AsyncEngine(Engine(**kwargs))``."""
    return AsyncEngine(Engine(**kwargs))
