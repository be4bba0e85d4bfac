"""The request fields that constrain the output: OpenAI's ``response_format`` and vLLM's
``structured_outputs`` extra body, both mapped onto `StructuredOutputsParams`.

- ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}`` (any
  JSON object), ``{"type": "json_schema", "json_schema": {"name", "schema", "strict",
  "description"}}`` (the output validates against ``schema``; ``strict`` is accepted either
  way: the grammar always enforces the schema).
- ``structured_outputs``: exactly one of ``json`` (a schema), ``regex``, ``choice``,
  ``grammar`` (Lark or GBNF), ``json_object``; any other key is refused, naming it.

A request may set one of the two. Whether the constraint compiles is the engine's check
(``grammar.py``), a 400 naming the field the request used.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmc.runtime.server.strict_types import Bool, Text
from llmc.runtime.structured.structured_outputs import StructuredOutputsParams


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: OpenAI's named schema."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: Text = Field(max_length=64)
    description: Text | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: Bool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: text, any JSON object, or JSON valid against a schema."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError('json_schema is required with, and only with, type "json_schema"')
        return self

    def params(self) -> StructuredOutputsParams | None:
        """The constraint, or None for ``text``."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        schema = self.json_schema.json_schema  # type: ignore[union-attr]
        return StructuredOutputsParams(json=schema if schema is not None else {})


class StructuredOutputsBody(BaseModel):
    """vLLM's ``structured_outputs`` extra body (its names; exactly one key set)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: dict[str, Any] | Text | None = Field(default=None, alias="json")
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None
    json_object: Bool | None = None

    def params(self) -> StructuredOutputsParams:
        """The constraint (its shape is checked when the engine validates it)."""
        return StructuredOutputsParams(
            json=self.json_,
            regex=self.regex,
            choice=tuple(self.choice) if self.choice is not None else None,
            grammar=self.grammar,
            json_object=bool(self.json_object),
        )


def structured_outputs_of(
    response_format: ResponseFormat | None, structured_outputs: StructuredOutputsBody | None
) -> tuple[StructuredOutputsParams | None, str]:
    """The request's constraint and the field that set it (``response_format`` or
    ``structured_outputs``: what a 400 about it names).

    Raises:
        ValueError: both fields set a constraint.
    """
    from_format = response_format.params() if response_format is not None else None
    if from_format is not None and structured_outputs is not None:
        raise ValueError("set response_format or structured_outputs, not both")
    if structured_outputs is not None:
        return structured_outputs.params(), "structured_outputs"
    return from_format, "response_format"
