"""The OpenAI wire format that the HTTP server speaks: request models (validated, 422 on bad input) and responses.

Only the fields gpufleet serves are declared; unknown fields that OpenAI clients send (``user``, ``logprobs``,
penalties, ...) are ignored rather than refused, so that stock clients work.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from gpufleet.serve.protocol import SamplingParams

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 256  # OpenAI has none for chat; a bound keeps a forgotten max_tokens from running long

TokenId = Annotated[int, Field(ge=0)]


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk that carries the usage and no choices."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, description="The base model's name or an adapter's name (GET /v1/models).")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 is greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = Field(None, description="Text that ends the output; it is not returned.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported: send one request per choice")
        return n

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> str | list[str] | None:
        items = [stop] if isinstance(stop, str) else (stop or [])
        if any(s == "" for s in items):
            raise ValueError("stop strings must not be empty")
        return stop

    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple, whichever form the client sent."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's view of the request. Stop strings stay with the server, which cuts the text exactly."""
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed)


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``: one prompt, as text or as token ids."""

    prompt: str | list[TokenId]
    max_tokens: int = Field(COMPLETIONS_DEFAULT_MAX_TOKENS, ge=1)

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and any(isinstance(p, str | list) for p in prompt):
            raise ValueError("a list of prompts is not supported: send one request per prompt")
        if isinstance(prompt, str | list) and len(prompt) == 0:
            raise ValueError("prompt must not be empty")
        return prompt


class TextPart(BaseModel):
    """One text part of a message's content (other part types, such as images, are refused)."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a conversation."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        """The content as one string (text parts joined, None as empty)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``: a conversation, rendered to one prompt by the server's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="OpenAI's newer name for max_tokens.")

    def token_budget(self) -> int:
        """``max_completion_tokens``, else ``max_tokens``, else the chat default."""
        return self.max_completion_tokens or self.max_tokens or CHAT_DEFAULT_MAX_TOKENS


# ---------------------------------------------------------------------------------------------- responses
class Usage(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    """A completion's text (whole, or one streamed piece)."""

    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None
    #: gpufleet's extension, in streamed chunks: the ids of the tokens this chunk's text came from (every
    #: generated token gets a chunk, also one without text), so that a front end can resume a request by id
    token_ids: list[int] | None = Field(default=None, exclude_if=lambda ids: ids is None)


class CompletionResponse(BaseModel):
    """The body of a non-streamed completion, and (with ``usage`` None) of each streamed chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    """The generated message of a chat completion."""

    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    """A chat completion's message and why it ended."""

    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    """The body of a non-streamed chat completion."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    """What a chat chunk adds: the role (first chunk), a piece of content, or nothing (last chunk)."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``{}`` for the last chunk and no ``role`` after the first, as OpenAI sends them."""
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    """One streamed piece of a chat completion."""

    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """One servable model: the base model, or an adapter with the base as ``parent``."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "gpufleet"
    parent: str | None = None


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error the server returns: ``{"error": {...}}``."""

    error: ErrorInfo
