"""Tool calling in a generic JSON format, enforced by a grammar (llama.cpp's "generic" format).

A model whose chat template has no tool syntax (Gemma 3's, most small models') is told about
the tools in a system instruction and answers with one JSON object: ``{"tool_calls": [{"name":
..., "arguments": {...}}]}`` to call tools, or ``{"response": "..."}`` to answer in text. The
answer's JSON schema (`ToolPlan.schema`) becomes the request's structured-output constraint
(``grammar.py``), so the output always parses: under ``tool_choice="required"`` or a named
function only the calls branch exists (each call's ``arguments`` valid against its function's
``parameters``); under ``"auto"`` either branch; ``parallel_tool_calls: false`` allows one call.
Earlier turns are written the same way: an assistant message's ``tool_calls`` as that JSON, and
each ``tool`` message as a user turn ``{"tool_response": {"tool_call_id", "content"}}``
(consecutive ones in one turn), so templates that insist on alternating roles accept them.

Each tool's ``parameters`` sit in the answer's schema as a schema resource of their own (an
``$id`` per tool; JSON Schema 2020-12 Core, §9.2 "Compound Documents", the way schemas are
bundled): their local references (``#``, ``#/$defs/...``, ``#/definitions/...``, anchors)
resolve against the parameters' root, as they do when the same schema is a ``response_format``,
and two tools' definitions of one name stay apart.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from llmc.runtime.server.tool_protocol import FunctionCall, ToolCall, ToolChoice, ToolDefinition

INSTRUCTIONS = (
    "You can call tools. To call one or more, answer with only a JSON object "
    '{{"tool_calls": [{{"name": <tool name>, "arguments": <arguments object>}}]}}. {text}'
    "The tools, as JSON schemas of their arguments:\n{tools}"
)
TEXT_ALLOWED = 'To answer without a tool, answer with only {"response": <your answer as text>}. '
# The base URI of a tool's parameters inside the answer's schema; nothing is fetched from it.
# Hierarchical (not a URN), so a relative "$id" nested in the parameters resolves per tool.
PARAMETERS_ID = "llmc:/tools/{name}/parameters"


@dataclass(frozen=True)
class ToolPlan:
    """The tools a request offers and how the model may use them.

    Attributes:
        tools: the functions the model may call (only the named one for a named choice).
        required: a call must be made (``"required"`` or a named function).
        parallel: several calls may be made at once.
    """

    tools: tuple[ToolDefinition, ...]
    required: bool
    parallel: bool

    def call_schema(self, arguments_key: str = "arguments") -> dict[str, Any]:
        """The JSON schema of one call: ``{"name": <a tool's name>, <arguments_key>: <its
        arguments>}``, the arguments valid against that tool's ``parameters``."""
        return {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": t.function.name},
                        arguments_key: _arguments_schema(t),
                    },
                    "required": ["name", arguments_key],
                    "additionalProperties": False,
                }
                for t in self.tools
            ]
        }

    def schema(self) -> dict[str, Any]:
        """The JSON schema of the model's answer in the generic format (module docstring)."""
        call = self.call_schema()
        calls = {"type": "array", "items": call, "minItems": 1}
        if not self.parallel:
            calls["maxItems"] = 1
        calls_answer = {
            "type": "object",
            "properties": {"tool_calls": calls},
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
        if self.required:
            return calls_answer
        text_answer = {
            "type": "object",
            "properties": {"response": {"type": "string"}},
            "required": ["response"],
            "additionalProperties": False,
        }
        return {"anyOf": [calls_answer, text_answer]}

    def instructions(self) -> str:
        """The system instruction that describes the tools and the answer's format."""
        tools = [
            {
                "name": t.function.name,
                "description": t.function.description or "",
                "parameters": t.function.parameters or {"type": "object"},
            }
            for t in self.tools
        ]
        text = "" if self.required else TEXT_ALLOWED
        return INSTRUCTIONS.format(text=text, tools=json.dumps(tools))


def _arguments_schema(tool: ToolDefinition) -> dict[str, Any]:
    """``tool``'s parameters as a schema resource of their own (module docstring), to be nested
    anywhere in a larger schema: their ``$id`` is ``PARAMETERS_ID`` (one the parameters set is
    replaced), and their ``$schema`` is dropped, since a draft-7 one makes a root ``$ref``
    ignore the ``$id`` beside it (draft 7 ignores every sibling of ``$ref``); the answer's schema
    is read as 2020-12 throughout."""
    parameters = tool.function.parameters or {"type": "object"}
    own = {key: value for key, value in parameters.items() if key not in ("$id", "$schema")}
    return {"$id": PARAMETERS_ID.format(name=tool.function.name), **own}


def plan_tools(
    tools: list[ToolDefinition] | None, tool_choice: ToolChoice | None, parallel: bool | None
) -> ToolPlan | None:
    """The request's `ToolPlan`, or None when no tool may be called (no tools, or
    ``tool_choice="none"``). ``tool_choice`` defaults to ``"auto"`` with tools, as OpenAI's.

    Raises:
        ValueError: a tool choice without tools, a named function that is not among them, or
            two tools with one name.
    """
    names = [t.function.name for t in tools or []]
    if len(set(names)) != len(names):
        raise ValueError(f"function names must be unique, got {names}")
    parallel = parallel is not False
    if tool_choice is None or tool_choice == "none":
        if tool_choice == "none" or not tools:
            return None
        return ToolPlan(tuple(tools), False, parallel)
    if not tools:
        raise ValueError("tool_choice needs tools: the request defines none")
    if isinstance(tool_choice, str):
        return ToolPlan(tuple(tools), tool_choice == "required", parallel)
    name = tool_choice.function.name
    if name not in names:
        raise ValueError(f"tool_choice names function {name!r}, which is not among the tools")
    return ToolPlan((tools[names.index(name)],), True, parallel)


def calls_text(calls: list[ToolCall]) -> str:
    """An assistant turn's tool calls in the generic format (their arguments parsed back)."""
    parsed = []
    for call in calls:
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError:
            arguments = call.function.arguments  # as the client sent it
        parsed.append({"name": call.function.name, "arguments": arguments})
    return json.dumps({"tool_calls": parsed})


def tool_response_text(tool_call_id: str, content: str) -> str:
    """A ``tool`` message's content as the user turn that carries it."""
    return json.dumps({"tool_response": {"tool_call_id": tool_call_id, "content": content}})


@dataclass(frozen=True)
class ParsedAnswer:
    """A tool-enabled answer: text content, the calls, or both (text before a native format's
    calls); content None when there is no text."""

    content: str | None
    calls: tuple[ToolCall, ...] = ()


def parse_answer(text: str) -> ParsedAnswer:
    """The content or calls of a generic-format answer. Text that is not a complete answer (cut
    by ``max_tokens``) is returned as the content, as it is."""
    try:
        answer = json.loads(text)
    except ValueError:
        return ParsedAnswer(text)
    if isinstance(answer, dict) and isinstance(answer.get("tool_calls"), list):
        calls = tuple(
            ToolCall(
                id=f"call_{uuid.uuid4().hex[:24]}",
                function=FunctionCall(name=c["name"], arguments=json.dumps(c["arguments"])),
            )
            for c in answer["tool_calls"]
        )
        return ParsedAnswer(None, calls)
    if isinstance(answer, dict) and isinstance(answer.get("response"), str):
        return ParsedAnswer(answer["response"])
    return ParsedAnswer(text)
