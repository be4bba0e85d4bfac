"""How a model writes tool calls: its chat template's own syntax, or llmc's generic JSON format.

A chat template that renders a ``tools`` variable was trained with a tool syntax of its own, and
the model calls tools best in it; llmc recognizes two families from the template's text (as
vLLM's ``--tool-call-parser`` names them) and falls back to the generic format
(``tool_calls.py``) for every other template:

- ``hermes`` (Hermes 2 Pro, Qwen 2.5 and Qwen 3, and the many templates derived from them; the
  template mentions ``<tool_call>``): each call is ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>``, any number of them, text before them allowed.
- ``llama3_json`` (Llama 3.1, 3.2 and 3.3; the template asks for a JSON ``"parameters"``
  object): the answer is one call ``{"name": ..., "parameters": {...}}``, optionally after
  ``<|python_tag|>``; these templates take one call per turn.

With a native format the template receives the tools (``tools=``, OpenAI's shape), assistant
messages' ``tool_calls`` (arguments as objects, as Hugging Face templates expect) and ``tool``
messages as they are. ``tool_choice="required"`` or a named function constrain the output to
the syntax with each call's arguments valid against its function's schema (a Lark grammar with
an embedded JSON schema, or the call's JSON schema); ``"auto"`` leaves the output free and
parses the calls from it, as vLLM's tool parsers do: an answer whose calls do not parse is
returned as text content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from llmc.runtime.server.tool_calls import ParsedAnswer, ToolPlan, parse_answer
from llmc.runtime.server.tool_protocol import FunctionCall, ToolCall
from llmc.runtime.structured.structured_outputs import StructuredOutputsParams

ToolFormatName = Literal["generic", "hermes", "llama3_json"]
TOOL_FORMATS: tuple[ToolFormatName, ...] = ("generic", "hermes", "llama3_json")

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_COMPACT_JSON = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


@dataclass(frozen=True)
class ToolFormat:
    """One tool-call syntax (see the module docstring).

    Attributes:
        name: ``generic``, ``hermes`` or ``llama3_json``.
    """

    name: ToolFormatName

    @property
    def native(self) -> bool:
        """The chat template renders the tools, the calls and the tool results itself."""
        return self.name != "generic"

    def instructions(self, plan: ToolPlan) -> str | None:
        """The system instruction describing the tools (the generic format's), or None."""
        return None if self.native else plan.instructions()

    def template_tools(self, plan: ToolPlan) -> list[dict[str, Any]] | None:
        """The chat template's ``tools`` argument (OpenAI's shape), or None (generic)."""
        if not self.native:
            return None
        return [t.model_dump(exclude_none=True) for t in plan.tools]

    def constraint(self, plan: ToolPlan) -> StructuredOutputsParams | None:
        """The output constraint: the generic answer's schema; a native format's call syntax
        when a call is required; None (free text, parsed) for a native ``auto``."""
        if not self.native:
            return StructuredOutputsParams(json=plan.schema())
        if not plan.required:
            return None
        if self.name == "llama3_json":
            return StructuredOutputsParams(json=plan.call_schema("parameters"))
        # JSON as json.dumps writes it (as the generic format's, grammar.py)
        schema = plan.call_schema("arguments") | {"x-guidance": _COMPACT_JSON}
        call = f'"<tool_call>\\n" %json {json.dumps(schema)} "\\n</tool_call>"'
        calls = 'call ("\\n" call)*' if plan.parallel else "call"
        return StructuredOutputsParams(grammar=f"start: {calls}\ncall: {call}\n")

    def parse(self, text: str) -> ParsedAnswer:
        """The content and calls of a finished answer (text that holds no complete, parsable
        call is returned as content, as it is)."""
        if self.name == "generic":
            return parse_answer(text)
        if self.name == "hermes":
            return _parse_hermes(text)
        return _parse_llama3_json(text)


def detect_tool_format(chat_template: str | dict[str, str] | None) -> ToolFormat:
    """The tool format of a tokenizer's ``chat_template`` (a named-templates dict: its
    ``tool_use`` template, else its ``default``): ``hermes`` or ``llama3_json`` when the
    template renders ``tools`` in that syntax, else ``generic``."""
    if isinstance(chat_template, dict):
        chat_template = chat_template.get("tool_use") or chat_template.get("default")
    if not chat_template or not re.search(r"\btools\b", chat_template):
        return ToolFormat("generic")
    if "<tool_call>" in chat_template:
        return ToolFormat("hermes")
    if '"parameters"' in chat_template and "<|start_header_id|>" in chat_template:
        return ToolFormat("llama3_json")
    return ToolFormat("generic")


def _call(payload: Any) -> ToolCall | None:
    """A call from ``{"name": str, "arguments" | "parameters": object}``, else None."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", payload.get("parameters"))
    if not isinstance(arguments, dict):
        return None
    return ToolCall(
        id=f"call_{uuid.uuid4().hex[:24]}",
        function=FunctionCall(name=payload["name"], arguments=json.dumps(arguments)),
    )


def _parse_hermes(text: str) -> ParsedAnswer:
    calls = []
    for body in _HERMES_CALL.findall(text):
        try:
            call = _call(json.loads(body))
        except ValueError:
            call = None
        if call is None:
            return ParsedAnswer(text)
        calls.append(call)
    if not calls:
        return ParsedAnswer(text)
    content = _HERMES_CALL.sub("", text).strip()
    return ParsedAnswer(content or None, tuple(calls))


def _parse_llama3_json(text: str) -> ParsedAnswer:
    body = text.strip().removeprefix(_PYTHON_TAG).strip()
    try:
        call = _call(json.loads(body))
    except ValueError:
        call = None
    return ParsedAnswer(text) if call is None else ParsedAnswer(None, (call,))
