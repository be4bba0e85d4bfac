"""Request bodies of the OpenAI-compatible API, as pydantic models.

The fields follow OpenAI's API reference for ``/v1/completions`` and ``/v1/chat/completions``;
``top_k``, ``min_p``, ``min_tokens``, ``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``,
``include_stop_str_in_output``, ``skip_special_tokens`` and ``return_tokens_as_token_ids`` are
vLLM's extensions, with vLLM's meanings. Unknown fields are ignored, as OpenAI does. Known
OpenAI fields that llmc cannot honour (logit_bias, tools, ...) are accepted at their neutral
value and refused otherwise, so a request is never silently served differently from what it
asked for.

Numbers, booleans and strings are strict: ``"0.5"`` is not a temperature, ``1`` is not ``true``,
NaN and infinities are refused. Every violation becomes a 400 in OpenAI's error body
(``errors.py``), as OpenAI and vLLM answer them; nothing here is a 422.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    field_validator,
)

from llmc.runtime.sampling_params import MAX_LOGPROBS

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]  # ints are accepted, strings and booleans are not
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
TokenIds = Annotated[list[Annotated[int, Strict(), Field(ge=0)]], Field(min_length=1)]

# OpenAI's limit on choices per request.
MAX_N = 128

# Field name -> the neutral values OpenAI treats as "off". Anything else is refused.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "tools": (None, []),
    "response_format": (None, {"type": "text"}),
}


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the token usage."""

    model_config = ConfigDict(extra="ignore")

    include_usage: Bool = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints; they map onto ``SamplingParams`` (see its docs)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: Str
    n: Int = Field(default=1, ge=1, le=MAX_N)
    best_of: Int | None = None
    temperature: Float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: Float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Int | None = Field(default=None, ge=-1)
    min_p: Float | None = Field(default=None, ge=0.0, le=1.0)
    seed: Int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # torch's seed range
    stop: Str | list[Str] | None = None
    stop_token_ids: list[Annotated[int, Strict(), Field(ge=0)]] | None = None
    min_tokens: Int = Field(default=0, ge=0)
    ignore_eos: Bool = False
    include_stop_str_in_output: Bool = False
    skip_special_tokens: Bool = True
    return_tokens_as_token_ids: Bool = False
    presence_penalty: Float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: Float | None = Field(default=None, gt=0.0)
    stream: Bool | None = False
    stream_options: StreamOptions | None = None
    user: Str | None = None

    logit_bias: dict[str, float] | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    suffix: Str | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k_off(cls, value: int | None) -> int | None:
        # vLLM clients send -1 (and some 0) for "top-k off"; llmc spells that None.
        return None if value is not None and value <= 0 else value

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

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value != info.data.get("n", 1):
            raise ValueError("best_of is not supported by llmc; leave it unset or equal to n")
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
    """``POST /v1/completions``. One prompt per request: a string or a list of token ids.

    ``logprobs`` (0..20) returns that many top logprobs per token besides the sampled one;
    ``echo`` puts the prompt before the completion, with its logprobs when ``logprobs`` is set.
    """

    prompt: Str | list[Str] | TokenIds | list[TokenIds]
    max_tokens: Int | None = Field(default=16, ge=1)
    logprobs: Int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: Bool = False

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

    @property
    def max_new_tokens(self) -> int | None:
        """The requested completion budget, or None for "up to the context limit"."""
        return self.max_tokens

    @property
    def sampled_logprobs(self) -> int | None:
        """``SamplingParams.logprobs``: top logprobs per generated token, or None."""
        return self.logprobs

    @property
    def prompt_logprobs(self) -> int | None:
        """``SamplingParams.prompt_logprobs``: only with ``echo`` (OpenAI's legacy scoring)."""
        return self.logprobs if self.echo else None


class ChatMessage(BaseModel):
    """One message of a chat. ``content`` is a string or a list of text parts."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Str | list[dict[str, Any]] | None = None
    name: Str | None = None

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
    ``max_tokens``; with neither set, generation may run to the end of the context.
    ``logprobs: true`` returns the sampled tokens' logprobs, ``top_logprobs`` (0..20) that many
    alternatives per token."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int | None = Field(default=None, ge=1)
    max_completion_tokens: Int | None = Field(default=None, ge=1)
    logprobs: Bool | None = False
    top_logprobs: Int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: Literal[False] | None = None  # vLLM's chat echo is not supported

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be true")
        return value

    @property
    def max_new_tokens(self) -> int | None:
        """The requested completion budget, or None for "up to the context limit"."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def sampled_logprobs(self) -> int | None:
        """``SamplingParams.logprobs``: top logprobs per generated token, or None."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def prompt_logprobs(self) -> int | None:
        """Chat never returns prompt logprobs."""
        return None
