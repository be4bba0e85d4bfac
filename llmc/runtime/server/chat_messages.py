"""One message of a chat request, as OpenAI's API defines it, and what reaches the chat template.

Honoured: ``role`` (system, developer, user, assistant, tool), ``content`` (a string, or a list
of text parts, joined), ``name`` (passed to the template, as vLLM does), an assistant message's
``tool_calls`` and a tool message's ``tool_call_id`` (written in the generic tool format,
``tool_calls.py``, or given as they are to a template that renders tools itself,
``tool_format.py``). Refused with a 400 naming them: ``function`` messages (OpenAI's deprecated
form), ``function_call``, ``audio``, ``refusal`` set to anything but their empty value; content
parts other than text (images, audio, files, refusals). Any other key is refused, as OpenAI
does.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from llmc.runtime.server.strict_types import Text
from llmc.runtime.server.tool_calls import calls_text, tool_response_text
from llmc.runtime.server.tool_protocol import ToolCall

# Field name -> its empty values; anything else is refused.
_REFUSED_FIELDS: dict[str, tuple[Any, ...]] = {
    "function_call": (None,),
    "audio": (None,),
    "refusal": (None,),
}


class TextPart(BaseModel):
    """A content part ``{"type": "text", "text": ...}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    """One message of ``messages``."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: Any = None
    tool_call_id: Text | None = None
    audio: Any = None
    refusal: Any = None

    @field_validator("role")
    @classmethod
    def _no_function_messages(cls, value: str) -> str:
        if value == "function":
            raise ValueError(
                "'function' messages are not supported; send 'tool' messages with tool_call_id"
            )
        return value

    @model_validator(mode="after")
    def _tool_fields_on_their_roles(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls is only allowed on assistant messages")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("tool_call_id is required on, and only on, tool messages")
        return self

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        # Before the union: an image part would otherwise be reported as "not a string".
        if isinstance(value, list):
            for part in value:
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise ValueError(
                        f"content parts of type {kind!a} are not supported; only 'text' parts"
                    )
        return value

    @field_validator(*_REFUSED_FIELDS)
    @classmethod
    def _empty_only(cls, value: Any, info: ValidationInfo) -> Any:
        if all(value != empty for empty in _REFUSED_FIELDS[info.field_name]):
            raise ValueError(f"{info.field_name} is not supported by llmc; leave it unset")
        return value

    def text(self) -> str:
        """The content as one string (text parts joined, None as "")."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)

    def template_input(self) -> dict[str, str]:
        """The message as the chat template receives it: role, content and, if set, name; tool
        calls and tool messages in the generic tool format (``tool_calls.py``)."""
        if self.role == "tool":
            return {"role": "user", "content": tool_response_text(self.tool_call_id, self.text())}
        content = calls_text(self.tool_calls) if self.tool_calls else self.text()
        message = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        return message

    def native_input(self) -> dict[str, Any]:
        """The message for a chat template that renders tools itself (Hugging Face's shape):
        an assistant's ``tool_calls`` with their arguments parsed back into objects, a
        ``tool`` message with its ``tool_call_id``."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": _arguments(c)}}
                for c in self.tool_calls
            ]  # fmt: skip
        return message


def _arguments(call: ToolCall) -> Any:
    """A call's arguments as an object; as the client sent them when they are not JSON."""
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments


def template_messages(
    messages: list[ChatMessage], instructions: str | None = None, native: bool = False
) -> list[dict]:
    """The conversation as the chat template receives it. ``native``: each message's
    `native_input` (the template renders tools itself). Otherwise each message's
    `template_input`, consecutive tool messages in one user turn, and ``instructions`` (the
    generic tool format's) at the start of the system message (a new one first when there
    is none)."""
    if native:
        return [m.native_input() for m in messages]
    out: list[dict] = []
    for i, m in enumerate(messages):
        message = m.template_input()
        if m.role == "tool" and i > 0 and messages[i - 1].role == "tool":
            out[-1]["content"] += "\n" + message["content"]
        else:
            out.append(message)
    if instructions:
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = out[0] | {"content": instructions + "\n\n" + out[0]["content"]}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out
