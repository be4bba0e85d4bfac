"""Request bodies of the OpenAI-compatible API, as pydantic models.

Every field of OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` requests is honoured or
refused with a 400 naming it; none is silently ignored:

- honoured: the sampling and stopping fields (see ``SamplingParams``), ``n``, ``best_of`` equal
  to ``n``, ``stream``, ``stream_options.include_usage``, ``logprobs``, ``top_logprobs``,
  ``echo``, ``max_tokens``, ``max_completion_tokens``, ``response_format``
  (``structured_protocol.py``), ``tools``, ``tool_choice`` and ``parallel_tool_calls``
  (``tool_calls.py``), and ``messages`` (``chat_messages.py``);
- accepted because they change nothing in the answer, at OpenAI either: ``user``,
  ``safety_identifier``, ``metadata``, ``prompt_cache_key`` (llmc's prefix cache needs no key),
  ``store`` false, ``service_tier`` "auto" or
  "default";
- refused unless at their empty value, until llmc implements them: ``function_call``
  ("none") and ``functions`` (OpenAI's deprecated form of tools), ``logit_bias``, ``suffix``,
  ``audio``, ``modalities`` (``["text"]``), ``prediction``, ``web_search_options``,
  ``reasoning_effort``, ``verbosity``, ``stream_options.include_obfuscation``.

vLLM's extensions, with vLLM's meanings: ``top_k``, ``min_p``, ``min_tokens``,
``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``, ``include_stop_str_in_output``,
``skip_special_tokens``, ``return_tokens_as_token_ids``, ``structured_outputs``. Any other field
is refused ("Unrecognized request argument supplied", as OpenAI answers; vLLM would ignore it).

Numbers, booleans and strings are strict: ``"0.5"`` is not a temperature, ``1`` is not ``true``,
NaN and infinities are refused, strings must be valid Unicode (``strict_types.py``). Bounds set by
the server's configuration (``n``, stop strings, logprobs) are checked after parsing, by
``RequestLimits`` (``limits.py``). Every violation becomes a 400 in OpenAI's error body
(``errors.py``), as OpenAI and vLLM answer them; nothing here is a 422.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, ValidationError

from llmc.runtime.server.chat_messages import ChatMessage
from llmc.runtime.server.strict_types import Bool, Float, Int, Text, TokenId, TokenIds
from llmc.runtime.server.structured_protocol import (
    ResponseFormat,
    StructuredOutputsBody,
    structured_outputs_of,
)
from llmc.runtime.server.tool_calls import ToolPlan, plan_tools
from llmc.runtime.server.tool_protocol import ToolChoice, ToolDefinition
from llmc.runtime.structured.structured_outputs import StructuredOutputsParams

# Field name -> the empty values OpenAI treats as "off". Anything else is refused.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "include_obfuscation": (None, False),
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "store": (None, False),
    "service_tier": (None, "auto", "default"),
}


def _error_at(field: str, value: Any, exc: ValueError) -> ValidationError:
    """``exc`` as pydantic's error at the request field ``field``, for a model validator to
    raise: its own errors have no location, and the 400 must name the field (``errors.py``)."""
    error = InitErrorDetails(type="value_error", loc=(field,), input=value, ctx={"error": exc})
    return ValidationError.from_exception_data("request", [error])


def _empty_only(cls: type, value: Any, info: ValidationInfo) -> Any:
    if all(value != empty for empty in _UNSUPPORTED[info.field_name]):
        raise ValueError(f"{info.field_name} is not supported by llmc; leave it unset")
    return value


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the token usage."""

    model_config = ConfigDict(extra="forbid")

    include_usage: Bool | None = False
    include_obfuscation: Any = None

    _refused = field_validator("include_obfuscation")(_empty_only)


class SamplingFields(BaseModel):
    """Fields shared by both endpoints; they map onto ``SamplingParams`` (see its docs)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # The request field whose value is ``sampled_logprobs`` (for the limit's error message).
    LOGPROBS_FIELD: ClassVar[str] = "logprobs"

    model: Text
    n: Int = Field(default=1, ge=1)
    best_of: Int | None = None
    temperature: Float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: Float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Int | None = Field(default=None, ge=-1)
    min_p: Float | None = Field(default=None, ge=0.0, le=1.0)
    seed: Int | None = Field(default=None, ge=0, le=2**64 - 1)  # uint64, as SamplingParams
    stop: Text | list[Text] | None = None
    stop_token_ids: list[TokenId] | None = None
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
    user: Text | None = None
    logit_bias: Any = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsBody | None = None

    _refused = field_validator("logit_bias")(_empty_only)

    @model_validator(mode="after")
    def _one_constraint(self) -> SamplingFields:
        try:
            self.constraint  # noqa: B018 -- raises ValueError when two fields set one
        except ValueError as exc:
            # Either conflict (the two constraint fields; tools and one of them) ends when the
            # client drops a constraint field: name structured_outputs when set, else the other.
            field = "response_format" if self.structured_outputs is None else "structured_outputs"
            raise _error_at(field, getattr(self, field), exc) from None
        return self

    @property
    def constraint(self) -> tuple[StructuredOutputsParams | None, str]:
        """The output constraint (``SamplingParams.structured_outputs``) and the request field
        that set it (``structured_protocol.structured_outputs_of``)."""
        return structured_outputs_of(self.response_format, self.structured_outputs)

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
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    @property
    def sampled_logprobs(self) -> int | None:
        """``SamplingParams.logprobs``: top logprobs per generated token, or None."""
        raise NotImplementedError


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``. One prompt per request: a string or a list of token ids.

    ``logprobs`` returns that many top logprobs per token besides the sampled one; ``echo`` puts
    the prompt before the completion, with its logprobs when ``logprobs`` is set.
    """

    prompt: Text | list[Text] | TokenIds | list[TokenIds]
    max_tokens: Int | None = Field(default=16, ge=1)
    logprobs: Int | None = Field(default=None, ge=0)
    echo: Bool = False
    suffix: Any = None

    _completion_refused = field_validator("suffix")(_empty_only)

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


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` is OpenAI's newer spelling of
    ``max_tokens``; with neither set, generation may run to the end of the context.
    ``logprobs: true`` returns the sampled tokens' logprobs, ``top_logprobs`` that many
    alternatives per token."""

    LOGPROBS_FIELD: ClassVar[str] = "top_logprobs"

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int | None = Field(default=None, ge=1)
    max_completion_tokens: Int | None = Field(default=None, ge=1)
    logprobs: Bool | None = False
    top_logprobs: Int | None = Field(default=None, ge=0)
    echo: Literal[False] | None = None  # vLLM's chat echo is not supported
    parallel_tool_calls: Bool | None = None
    metadata: dict[Text, Text] | None = None
    prompt_cache_key: Text | None = None
    safety_identifier: Text | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    store: Any = None
    service_tier: Any = None

    _chat_refused = field_validator(
        "functions",
        "function_call",
        "audio",
        "modalities",
        "prediction",
        "web_search_options",
        "reasoning_effort",
        "verbosity",
        "store",
        "service_tier",
    )(_empty_only)

    @field_validator("tools")
    @classmethod
    def _tools_plannable(cls, value: list[ToolDefinition] | None) -> Any:
        plan_tools(value, None, None)  # raises when two tools share a name
        return value

    @field_validator("tool_choice")
    @classmethod
    def _choice_among_tools(cls, value: ToolChoice | None, info: ValidationInfo) -> Any:
        if "tools" in info.data:  # else the tools' own error is the one to report
            plan_tools(info.data["tools"], value, None)
        return value

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

    @property
    def tool_plan(self) -> ToolPlan | None:
        """The tools the model may call and how (``tool_calls.plan_tools``), or None. Never
        raises on a parsed request: ``tools`` and ``tool_choice`` were planned when parsed."""
        return plan_tools(self.tools, self.tool_choice, self.parallel_tool_calls)

    @property
    def constraint(self) -> tuple[StructuredOutputsParams | None, str]:
        """As `SamplingFields.constraint`; with tools to call, None set by ``tools``: the tools'
        constraint depends on the model's tool syntax (``tool_format.ToolFormat.constraint``).

        Raises:
            ValueError: tools to call and a response_format or structured_outputs as well.
        """
        plan = self.tool_plan
        constraint = structured_outputs_of(self.response_format, self.structured_outputs)
        if plan is None:
            return constraint
        if constraint[0] is not None:
            raise ValueError(
                "response_format and structured_outputs cannot be combined with tools "
                'unless tool_choice is "none"'
            )
        return None, "tools"
