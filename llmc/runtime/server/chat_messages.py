"""One message of a chat request, as OpenAI's API defines it, and what reaches the chat template.

Honoured: ``role`` (system, developer, user, assistant), ``content`` (a string, or a list of
text parts, joined), ``name`` (passed to the template, as vLLM does). Refused with a 400 naming
them, until llmc implements tool calling: ``tool`` and ``function`` messages, and ``tool_calls``,
``function_call``, ``tool_call_id``, ``audio``, ``refusal`` set to anything but their empty value;
content parts other than text (images, audio, files, refusals). Any other key is refused, as
OpenAI does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from llmc.runtime.server.strict_types import Text

# Field name -> its empty values; anything else is refused.
_TOOL_FIELDS: dict[str, tuple[Any, ...]] = {
    "tool_calls": (None, []),
    "function_call": (None,),
    "tool_call_id": (None,),
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
    tool_calls: Any = None
    function_call: Any = None
    tool_call_id: Any = None
    audio: Any = None
    refusal: Any = None

    @field_validator("role")
    @classmethod
    def _no_tool_messages(cls, value: str) -> str:
        if value in ("tool", "function"):
            raise ValueError(
                f"'{value}' messages are not supported: llmc does not implement tool calling yet"
            )
        return value

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

    @field_validator(*_TOOL_FIELDS)
    @classmethod
    def _empty_only(cls, value: Any, info: ValidationInfo) -> Any:
        if all(value != empty for empty in _TOOL_FIELDS[info.field_name]):
            raise ValueError(
                f"{info.field_name} is not supported by llmc (no tool calling yet); leave it unset"
            )
        return value

    def text(self) -> str:
        """The content as one string (text parts joined, None as "")."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)

    def template_input(self) -> dict[str, str]:
        """The message as the chat template receives it: role, content and, if set, name."""
        message = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        return message
