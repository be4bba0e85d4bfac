"""What a constrained request's output must match: vLLM's ``StructuredOutputsParams``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmc.runtime.errors import InvalidRequestError

#: The SamplingParams field these parameters live in (named by the errors they raise).
FIELD = "structured_outputs"


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one constraint on a completion's text (vLLM's names and meanings).

    Attributes:
        json: a JSON schema (a dict, or its JSON text): the output is one JSON value that
            validates against it (llguidance's JSON schema support: objects, arrays with
            bounds, enums, ``anyOf``, ``$ref``, string lengths and patterns, number bounds).
        regex: the output matches this regular expression (Rust ``regex`` syntax).
        choice: the output is exactly one of these strings.
        grammar: a context-free grammar in Lark syntax (llguidance's dialect) or GBNF
            (llama.cpp's), detected from the text.
        json_object: the output is one JSON object, any (OpenAI's ``{"type": "json_object"}``).
    """

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        if self.choice is not None and not isinstance(self.choice, tuple):
            object.__setattr__(self, "choice", tuple(self.choice))

    def kind(self) -> str:
        """Which constraint is set: ``json``, ``regex``, ``choice``, ``grammar`` or
        ``json_object``.

        Raises:
            InvalidRequestError: (field ``structured_outputs``) when none or several are set.
        """
        set_ = [
            name
            for name in ("json", "regex", "choice", "grammar")
            if getattr(self, name) is not None
        ] + (["json_object"] if self.json_object else [])
        if len(set_) != 1:
            raise InvalidRequestError(
                f"{FIELD} must set exactly one of json, regex, choice, grammar or json_object; "
                f"got {set_ or 'none'}",
                FIELD,
            )
        return set_[0]

    def validate(self) -> None:
        """Check the fields' types (the grammar itself is checked when compiled).

        Raises:
            InvalidRequestError: (field ``structured_outputs``) naming what is wrong.
        """
        kind = self.kind()
        value = getattr(self, kind)
        if kind == "json" and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise InvalidRequestError(f"{FIELD}.json is not valid JSON: {exc}", FIELD) from exc
        if kind == "json" and not isinstance(value, dict | bool):
            raise InvalidRequestError(f"{FIELD}.json must be a JSON schema object", FIELD)
        if kind in ("regex", "grammar") and (not isinstance(value, str) or not value):
            raise InvalidRequestError(f"{FIELD}.{kind} must be a non-empty string", FIELD)
        if kind == "choice" and (not value or not all(isinstance(c, str) and c for c in value)):
            raise InvalidRequestError(
                f"{FIELD}.choice must be a non-empty list of non-empty strings", FIELD
            )

    def key(self) -> str:
        """A canonical text of the constraint: equal constraints have equal keys (the
        compiled-grammar cache's key)."""
        kind = self.kind()
        value = getattr(self, kind)
        if kind == "json" and isinstance(value, str):
            value = json.loads(value)
        return json.dumps([kind, value], sort_keys=True, separators=(",", ":"))
