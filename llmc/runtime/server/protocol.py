"""Request bodies of the OpenAI-compatible API, as pydantic models.

The fields follow OpenAI's API reference for ``/v1/completions`` and ``/v1/chat/completions``;
``top_k``, ``stop_token_ids`` and ``ignore_eos`` are vLLM's extensions. Unknown fields are
ignored, as OpenAI does. Known OpenAI fields that llmc cannot honour (penalties, logprobs, ...)
are accepted at their neutral value and refused otherwise, so a request is never silently
served differently from what it asked for.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]

# Field name -> the neutral value OpenAI treats as "off". Anything else is refused.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "tools": (None, []),
    "response_format": (None, {"type": "text"}),
}


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the token usage."""

    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints; they map onto ``SamplingParams``."""

    model_config = ConfigDict(extra="ignore")

    model: str
    n: int | None = Field(default=1, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # torch's seed range
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    ignore_eos: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    best_of: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    echo: bool | None = None
    suffix: str | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k_off(cls, value: int | None) -> int | None:
        # vLLM clients send -1 (and some 0) for "top-k off"; llmc spells that None.
        return None if value is not None and value <= 0 else value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int:
        if value not in (None, 1):
            raise ValueError("n must be 1: llmc serves one choice per request")
        return 1

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions | None, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    @field_validator(*_UNSUPPORTED)
    @classmethod
    def _neutral_only(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and all(value != v for v in _UNSUPPORTED[info.field_name]):
            raise ValueError(f"{info.field_name} is not supported by llmc; leave it unset")
        return value

    @property
    def stop_list(self) -> list[str]:
        """``stop`` as a list of non-empty strings."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stops if s]

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``. One prompt per request: a string or a list of token ids."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(default=16, ge=1)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, str):
            return value
        if not value:
            raise ValueError("prompt must not be empty")
        if isinstance(value[0], int):
            return value
        if len(value) != 1:
            raise ValueError("batched prompts are not supported: send one prompt per request")
        return value[0]


class ChatMessage(BaseModel):
    """One message of a chat. ``content`` is a string or a list of text parts."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's content as one string; raises ValueError on non-text parts."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` is OpenAI's newer spelling of
    ``max_tokens``; with neither set, generation may run to the end of the context."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @property
    def max_new_tokens(self) -> int | None:
        """The requested completion budget, or None for "up to the context limit"."""
        return self.max_completion_tokens or self.max_tokens
