"""The tool-calling fields of a chat request and response, as OpenAI's API defines them.

Request: ``tools`` (function tools: name, description, JSON-schema ``parameters``),
``tool_choice`` (``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "function":
{"name": ...}}``), ``parallel_tool_calls``; assistant messages carrying ``tool_calls`` and
``tool`` messages answering them (``chat_messages.py``). Response: ``message.tool_calls``, each
with an id, the function's name and its arguments as JSON text; ``finish_reason:
"tool_calls"``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llmc.runtime.server.strict_types import Bool, Text

#: OpenAI's rule for function names.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class FunctionDefinition(BaseModel):
    """A function the model may call."""

    model_config = ConfigDict(extra="forbid")

    name: Text = Field(pattern=NAME_PATTERN)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None


class ToolDefinition(BaseModel):
    """One entry of ``tools``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    """``tool_choice.function``: the name of the function to call."""

    model_config = ConfigDict(extra="forbid")

    name: Text


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming the one function to call."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    """A call's function: its name and its arguments as JSON text."""

    name: Text
    arguments: Text


class ToolCall(BaseModel):
    """One tool call, in an assistant message of the request or of the response."""

    model_config = ConfigDict(extra="forbid")

    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(BaseModel):
    """A streamed call's function (the whole name and arguments in one delta)."""

    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """One streamed tool call, assembled by the client by ``index``."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta
