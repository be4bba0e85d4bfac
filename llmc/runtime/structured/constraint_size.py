"""How large a structured-output constraint is, in the measures a server bounds before it
compiles one: its bytes, its ``choice`` strings and its largest counted repetition.

Compile cost grows with each: llguidance's lexer unrolls a counted repetition (``a{1000000}``
ran out of lexer states at the first token), a ``choice`` becomes one alternation, and a schema
or grammar is parsed whole. Repetitions are read from regexes (``{n}``, ``{n,}``, ``{n,m}``,
not escaped), Lark's ``~ n`` / ``~ n..m``, and a JSON schema's ``pattern`` and
``patternProperties`` regexes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from llmc.runtime.structured.structured_outputs import StructuredOutputsParams

_BRACES = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_LARK_REPEAT = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?")


@dataclass(frozen=True)
class ConstraintSize:
    """The measures of one constraint.

    Attributes:
        num_bytes: UTF-8 bytes of the constraint (a schema as compact JSON; choices summed).
        num_choices: strings of a ``choice`` constraint, else 0.
        max_repeat: the largest repetition count it spells, else 0.
    """

    num_bytes: int
    num_choices: int
    max_repeat: int


def constraint_size(params: StructuredOutputsParams) -> ConstraintSize:
    """The size of ``params`` (one constraint set: ``params.kind()`` must not raise)."""
    kind = params.kind()
    if kind == "choice":
        choices = params.choice or ()
        num_bytes = sum(len(c.encode("utf-8", "surrogatepass")) for c in choices)
        return ConstraintSize(num_bytes, len(choices), 0)
    if kind == "json":
        schema = params.json
        text = schema if isinstance(schema, str) else json.dumps(schema, separators=(",", ":"))
        if isinstance(schema, str):
            schema = json.loads(schema)
        repeat = max((_max_repeat(p) for p in _schema_patterns(schema)), default=0)
        return ConstraintSize(len(text.encode("utf-8", "surrogatepass")), 0, repeat)
    text = params.regex if kind == "regex" else params.grammar if kind == "grammar" else ""
    text = text or ""
    repeat = _max_repeat(text)
    if kind == "grammar":
        repeat = max(repeat, _max_count(_LARK_REPEAT, text))
    return ConstraintSize(len(text.encode("utf-8", "surrogatepass")), 0, repeat)


def _max_repeat(regex: str) -> int:
    """The largest count of ``regex``'s counted repetitions, else 0."""
    return _max_count(_BRACES, regex)


def _max_count(pattern: re.Pattern[str], text: str) -> int:
    """The largest number in ``pattern``'s groups over ``text``, else 0 (numbers past 18
    digits count as 10**18: Python refuses to parse very long ones)."""
    counts = (n for m in pattern.finditer(text) for n in m.groups() if n)
    return max((int(n) if len(n) <= 18 else 10**18 for n in counts), default=0)


def _schema_patterns(node: object) -> Iterator[str]:
    """Every ``pattern`` and ``patternProperties`` regex in a JSON schema, at any depth."""
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "pattern" and isinstance(value, str):
                    yield value
                elif key == "patternProperties" and isinstance(value, dict):
                    yield from (k for k in value if isinstance(k, str))
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
