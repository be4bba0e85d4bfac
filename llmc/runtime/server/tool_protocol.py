"""The tool-calling fields of a chat request and response, as OpenAI's API defines them.

Request: ``tools`` (function tools: name, description, JSON-schema ``parameters``),
``tool_choice`` (``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "function":
{"name": ...}}``), ``parallel_tool_calls``; assistant messages carrying ``tool_calls`` and
``tool`` messages answering them (``chat_messages.py``). Response: ``message.tool_calls``, each
with an id, the function's name and its arguments as JSON text; ``finish_reason:
"tool_calls"``.

A function's ``parameters`` may refer only within themselves (``"$ref": "#"``,
``"#/$defs/..."``, ``"#/definitions/..."``, an anchor), as pydantic's ``model_json_schema()``
writes them: another document (``https://...``, ``other.json``) is a 400 naming ``tools``, since
nothing can fetch it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmc.runtime.server.strict_types import Bool, Text

#: OpenAI's rule for function names.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# Keywords whose value is data, not a schema: a {"$ref": ...} inside one is not a reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords whose value maps names (of properties, definitions) to schemas.
_NAMED_SCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def schema_refs(schema: Any) -> Iterator[str]:
    """Every ``$ref`` of a JSON schema, at any depth, in no particular order (the values of
    ``const``, ``enum``, ``default`` and ``examples`` are data, and are not searched). A loop,
    not recursion: a client's schema may nest as deep as the JSON parser allows."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            elif key in _NAMED_SCHEMAS and isinstance(value, dict):
                pending.extend(value.values())  # a property named "enum" is still a schema
            elif key not in _DATA_KEYWORDS:
                pending.append(value)


class FunctionDefinition(BaseModel):
    """A function the model may call."""

    model_config = ConfigDict(extra="forbid")

    name: Text = Field(pattern=NAME_PATTERN)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None

    @field_validator("parameters")
    @classmethod
    def _local_refs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for ref in schema_refs(value):
            if not ref.startswith("#"):
                raise ValueError(
                    f"$ref {ref!r} refers outside the parameters, which is not supported; "
                    "refer within them ('#/$defs/<name>') or write the schema in place"
                )
        return value


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
