"""A deterministic ``GenerationBackend`` without a model, for tests, demos and placement experiments.

Tokens are characters (token id = Unicode code point). The "model" echoes the prompt: output token i is prompt
token i (cyclically), whatever the temperature. Stop strings are the server's job (it cuts text exactly); this
backend honours ``max_tokens`` and ``stop_token_ids``, and records the other sampling parameters in ``received``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from gpufleet.errors import ServeError
from gpufleet.serve.placement import DEFAULT_BLOCK_SIZE, DEFAULT_MAX_BATCH, InstanceState, RunningRequest
from gpufleet.serve.protocol import GenerationChunk, OverloadedError, SamplingParams, UnknownAdapterError

MAX_CODE_POINT = 0x10FFFF


class FakeBackend:
    """Echoes prompts token by token, with an optional delay per token, a queue limit and a failure trigger.

    ``max_queue``: requests in flight beyond it raise ``OverloadedError``. ``fail_marker``: a text prompt that
    contains it raises ``RuntimeError`` before the first chunk (a backend bug, for 500 handling). ``state()``
    reports a KV cache of ``total_blocks`` blocks for ``PlacementFrontend``. ``received``, ``cancelled`` and
    ``finished`` record what happened, by request id.
    """

    def __init__(
        self,
        *,
        base_model: str = "fake-base",
        adapters: Sequence[str] = ("alpha", "beta"),
        delay: float = 0.0,
        max_queue: int | None = None,
        fail_marker: str | None = None,
        instance_id: str = "fake-0",
        total_blocks: int = 1 << 20,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_batch: int = DEFAULT_MAX_BATCH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_model = base_model
        self.adapters = list(adapters)
        self.delay = delay
        self.max_queue = max_queue
        self.fail_marker = fail_marker
        self.instance_id, self.total_blocks, self.block_size, self.max_batch = (
            instance_id,
            total_blocks,
            block_size,
            max_batch,
        )
        self._clock = clock
        self.running: dict[str, RunningRequest] = {}
        self.received: list[tuple[str, str | list[int], str | None, SamplingParams]] = []
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self.loaded_from: dict[str, Path] = {}

    # ------------------------------------------------------------------------------------------- tokenizer
    @staticmethod
    def encode(text: str) -> list[int]:
        """One token per character."""
        return [ord(c) for c in text]

    @staticmethod
    def decode(ids: Sequence[int]) -> str:
        """Characters of the ids (ids past the last code point read as U+FFFD)."""
        return "".join(chr(i) if 0 <= i <= MAX_CODE_POINT else "\ufffd" for i in ids)

    def count_tokens(self, prompt: str) -> int:
        """Prompt length in tokens (for ``PlacementFrontend``)."""
        return len(prompt)

    # --------------------------------------------------------------------------------------------- backend
    def base_model_name(self) -> str:
        """The base model's name."""
        return self.base_model

    def adapter_names(self) -> list[str]:
        """The adapters served."""
        return list(self.adapters)

    async def load_adapter(self, name: str, folder: Path) -> None:
        """Serve ``name`` from now on (the folder is recorded in ``loaded_from``, not read)."""
        if name in self.adapters:
            raise ServeError(f"adapter '{name}' is already served")
        self.adapters.append(name)
        self.loaded_from[name] = Path(folder)

    async def unload_adapter(self, name: str) -> None:
        """Stop serving ``name``; refused while a request for it runs (the server waits for them first)."""
        if any(r.lora_id == name for r in self.running.values()):
            raise ServeError(f"adapter '{name}' is in use by a running request")
        self.adapters.remove(name)
        self.loaded_from.pop(name, None)

    def state(self) -> InstanceState:
        """What placement needs: capacity and what runs here."""
        return InstanceState(
            self.instance_id,
            self.total_blocks,
            self.block_size,
            self.max_batch,
            {rid: RunningRequest(r.arrival, r.request_id, r.lora_id, r.tokens) for rid, r in self.running.items()},
        )

    async def generate(
        self, prompt: str | list[int], adapter: str | None, params: SamplingParams, request_id: str
    ) -> AsyncIterator[GenerationChunk]:
        """Echo the prompt; refusals raise before the first chunk."""
        ids = self._admit(prompt, adapter, params, request_id)
        self.running[request_id] = RunningRequest(self._clock(), request_id, adapter, len(ids))
        done = False
        try:
            async for chunk in self._echo(ids, params, request_id):
                self.running[request_id].tokens += 1
                done = chunk.finish_reason is not None  # finished even if the consumer closes us right after
                yield chunk
        finally:
            del self.running[request_id]
            (self.finished if done else self.cancelled).append(request_id)

    def _admit(
        self, prompt: str | list[int], adapter: str | None, params: SamplingParams, request_id: str
    ) -> list[int]:
        if adapter is not None and adapter not in self.adapters:
            raise UnknownAdapterError(f"adapter '{adapter}' is not loaded (adapters: {', '.join(self.adapters)}).")
        if self.max_queue is not None and len(self.running) >= self.max_queue:
            raise OverloadedError(f"{len(self.running)} requests in flight, the limit is {self.max_queue}")
        if self.fail_marker is not None and isinstance(prompt, str) and self.fail_marker in prompt:
            raise RuntimeError(f"fake backend failure triggered by {self.fail_marker!r}")
        self.received.append((request_id, prompt, adapter, params))
        return self.encode(prompt) if isinstance(prompt, str) else list(prompt)

    async def _echo(self, ids: list[int], params: SamplingParams, request_id: str) -> AsyncIterator[GenerationChunk]:
        for i in range(params.max_tokens):
            await asyncio.sleep(self.delay)
            token = ids[i % len(ids)]
            stop = token in params.stop_token_ids
            reason = "stop" if stop else ("length" if i + 1 == params.max_tokens else None)
            yield GenerationChunk(
                request_id,
                token,
                "" if stop else self.decode([token]),
                reason,
                prompt_tokens=len(ids),
                completion_tokens=i + 1,
            )
            if reason is not None:
                return
