"""What the HTTP server and the placement layer need from an engine, and nothing more (no torch here).

An engine (one process, one GPU) or the placement front end (several engines) implements ``GenerationBackend``;
the server turns OpenAI requests into ``generate`` calls and streams the chunks back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.errors import ServeError


class UnknownAdapterError(ServeError):
    """The request names an adapter that the server does not have (HTTP 404)."""


class OverloadedError(ServeError):
    """The queue is full: the request is refused rather than queued without bound (HTTP 429)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. ``temperature`` 0 is greedy decoding."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass
class GenerationChunk:
    """One step of one request's output: the new token and its text, and why it finished (None while running)."""

    request_id: str
    token_id: int
    text: str
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    extra: dict = field(default_factory=dict)


class GenerationBackend(Protocol):
    """An engine or a front end over several: lists adapters, generates token by token."""

    def base_model_name(self) -> str: ...

    def adapter_names(self) -> list[str]: ...

    def generate(
        self, prompt: str | list[int], adapter: str | None, params: SamplingParams, request_id: str
    ) -> AsyncIterator[GenerationChunk]:
        """Stream the request's chunks; raises UnknownAdapterError / OverloadedError before the first one."""
        ...
