"""Response bodies of the OpenAI-compatible API, field for field as OpenAI sends them.

Non-streamed: ``CompletionResponse`` (``object="text_completion"``) and ``ChatCompletionResponse``
(``"chat.completion"``). Streamed, one per SSE event: ``CompletionResponse`` again (OpenAI streams
completions in the same schema, text being the delta) and ``ChatCompletionChunk``
(``"chat.completion.chunk"``). Log-probs come in OpenAI's two formats: the legacy one of
completions (``CompletionLogprobs``: parallel lists) and the chat one (``ChatLogprobs``: one
entry per token, with its UTF-8 bytes and alternatives).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from llmc.runtime.server.tool_protocol import ToolCall, ToolCallDelta

# "stop", "length", or "abort" (vLLM's: the server ended the request, e.g. at shutdown).
FinishReason = str


def _now() -> int:
    return int(time.time())


class UsageInfo(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> UsageInfo:
        """Usage with ``total_tokens`` filled in."""
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy log-probs of ``/v1/completions``: one entry per token in each list.

    ``token_logprobs`` and ``top_logprobs`` are None for the first prompt token (echo), which
    nothing predicts; ``text_offset`` is each token's character offset in the choice's text.
    """

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    """One choice of a completion; in a stream, ``text`` is the new text only."""

    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class TopLogprob(BaseModel):
    """One alternative token of a chat log-prob entry."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    """The log-prob of one generated token of a chat completion and its top alternatives."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    """``choices[i].logprobs`` of a chat completion or chunk."""

    content: list[ChatTokenLogprob] | None = None
    refusal: None = None


class CompletionResponse(BaseModel):
    """``/v1/completions`` response, and each event of its stream."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo | None = None


class AssistantMessage(BaseModel):
    """The generated message of a chat completion."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


class ChatCompletionChoice(BaseModel):
    """One choice of a non-streamed chat completion."""

    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionResponse(BaseModel):
    """``/v1/chat/completions`` response (non-streamed)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo


class DeltaMessage(BaseModel):
    """What a chat chunk adds to the message. Unset fields are left out, as OpenAI does:
    the first chunk carries ``role``, the next ones ``content`` (or ``tool_calls``), the last
    one nothing."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatCompletionStreamChoice(BaseModel):
    """One choice of a chat chunk."""

    index: int = 0
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """One event of a streamed ``/v1/chat/completions`` response."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionStreamChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    """One entry of ``/v1/models``; ``root``, ``parent`` and ``max_model_len`` are vLLM's
    extensions (a LoRA adapter: its directory, and the base model it runs on)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "llmc"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    """``/v1/models`` response."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
