"""Fuzzing the real uvicorn server over a real tiny engine: no request can stop the server, and a
constrained request's output satisfies its constraint.

Generators, all bounded for CI:

- schemathesis, from the server's own ``/openapi.json`` (its request bodies are the pydantic
  models of ``protocol.py``): the coverage phase (every field at and past its bounds) and the
  fuzzing phase, positive and negative data, on every operation. The schema is narrowed to the
  one model name the server serves, or nearly every request would stop at the 404.
- hypothesis strategies over the request models' fields (`engine_requests`), for requests that
  reach the engine: extreme seeds, many stop strings, lone surrogates, ``n`` at and past the
  server's limit, logprobs, echo, streaming, unknown fields.
- hypothesis strategies over the constraint fields (`constrained_requests`, `tool_requests`):
  ``response_format`` (``json_schema``, ``json_object``), vLLM's ``structured_outputs``
  (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``) and chat ``tools`` /
  ``tool_choice``, with generated JSON schemas (`schemas`: objects, arrays with bounds, enums,
  ``anyOf``/``allOf``/``oneOf``, ``$defs`` and ``$ref`` to themselves and to the root, string
  patterns and lengths, number bounds, ``required``, ``additionalProperties``), regexes, Lark
  and GBNF grammars and choice lists; and hostile ones: counts at and past the server's bounds
  (``{n}`` repetitions, ``minLength`` 10**6, choices, constraint bytes), recursive required
  ``$ref``, ``$ref`` cycles, non-local ``$ref``, unknown and unsupported keywords, invalid
  regexes, random grammar text, choice lists with empty and duplicate strings. They run on a
  second server whose context holds the tools' instructions (`constrained`).

Every response must be a 2xx or a 4xx in OpenAI's error body (`response_problem`): no 5xx, no
in-band error event in a stream but a request's own failed constraint (``invalid_request_error``,
``constraint_failed``), no hang (a client timeout far above the slowest legitimate request);
data outside the schema must be refused. A constrained choice that finished on its own
(``stop``, ``tool_calls``) must satisfy its constraint (`constraint_problem`). Afterwards each
server still serves a normal completion, ``/health`` is 200 and every KV block is back in the
pool. ``benchmarks/fuzz_server.py`` runs the same generators for longer and counts instead of
stopping at the first failure.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import jsonschema
import pytest
import referencing.exceptions
import requests
import schemathesis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from schemathesis.checks import negative_data_rejection, not_a_server_error

from llmc.runtime.sampling_params import MAX_LOGPROBS
from llmc.runtime.server.chat_messages import ChatMessage
from llmc.runtime.server.limits import RequestLimits
from llmc.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.runtime.test_server import MODEL, _wait_until

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 64 * 1024
VOCAB_SIZE = 512  # the tiny models' vocabulary; ids past it are in the strategies on purpose
# A request unanswered this long has hung. The slowest legitimate one here (``MAX_N`` choices
# to the end of the context on 32 blocks, preempting one another) takes seconds on 2 busy
# cores: a liveness bound, not a speed assertion.
HANG_S = 60.0
#: Events schemathesis reads of a stream before it stops: more than any stream here has.
STREAM_EVENTS = 100_000
JSON = {"content-type": "application/json"}
MAX_N = RequestLimits().max_n  # n past it gets a 400
SCHEMA_CHECKS = [not_a_server_error, negative_data_rejection]
DROPPED_AFTER = "the connection was dropped after a"


def response_problem(status: int, content_type: str, text: str, path: str = "") -> str | None:
    """What is wrong with a response, or None: a 5xx; a 4xx without OpenAI's error body; a
    stream without its closing ``[DONE]``, or with an in-band error event other than the
    request's own failed constraint (``invalid_request_error``, ``constraint_failed``, in
    OpenAI's error body). The KServe v2 routes (``path`` under ``/v2``) answer in their
    protocol instead (``v2_problem``)."""
    if status >= 500:
        return f"{status}: {text[:500]}"
    if path.startswith("/v2"):
        return v2_problem(status, content_type, text)
    if status >= 400:
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            error = None
        if not _is_error_body(error):
            return f"{status} without OpenAI's error body: {text[:500]}"
    elif content_type.startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in text.splitlines() if line]
        if not events or events[-1] != "[DONE]":
            return f"stream cut short: ...{text[-500:]}"
        for event in events[:-1]:
            error = json.loads(event).get("error")
            if error is not None and not (
                _is_error_body(error)
                and (error["type"], error["code"]) == ("invalid_request_error", "constraint_failed")
            ):
                return f"in-band error event: {event[:500]}"
    return None


def v2_problem(status: int, content_type: str, text: str) -> str | None:
    """What is wrong with a KServe v2 response below 500: a 4xx without an error body (the
    protocol's ``{"error": message}`` from the v2 routes, or OpenAI's from what answers before
    any route: the API key, body size and method checks), or a generate stream event that is
    neither a text output nor an error."""
    if status >= 400:
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            error = None
        if (isinstance(error, str) and error) or _is_error_body(error):
            return None
        return f"{status} without an error body: {text[:500]}"
    if content_type.startswith("text/event-stream"):
        for line in filter(None, text.splitlines()):
            event = json.loads(line.removeprefix("data: "))
            if "text_output" not in event and "error" not in event:
                return f"v2 stream event without text_output: {line[:500]}"
    return None


def _is_error_body(error: object) -> bool:
    return isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}


def openapi_schema(base_url: str, model: str, api_key: str | None) -> schemathesis.BaseSchema:
    """The server's own ``/openapi.json`` as a schemathesis schema, ``model`` narrowed to the
    one model the server serves; requests go to ``base_url`` with the API key."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    raw = httpx.get(base_url + "/openapi.json", headers=headers, timeout=30).json()
    for name in (CompletionRequest.__name__, ChatCompletionRequest.__name__):
        raw["components"]["schemas"][name]["properties"]["model"] = {"enum": [model]}
    schema = schemathesis.openapi.from_dict(raw)
    schema.config.update(base_url=base_url, headers=headers, request_timeout=HANG_S)
    # schemathesis stops reading an event stream after 20 events by default: read each to its
    # end (or to HANG_S in total), so that a stream's own end is what is checked.
    schema.config.max_stream_events = STREAM_EVENTS
    schema.config.output.sanitization.update(enabled=False)  # "max_tokens" is no secret
    return schema


# --- requests that reach the engine, from the request models' fields -------------------------

_SEEDS = st.one_of(
    st.sampled_from([0, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -1, -(2**63)]),
    st.integers(-(2**63), 2**64 - 1),
)
# Any text; one in eight with lone surrogates (json.dumps writes them as \udxxx escapes),
# rarely enough that most requests still reach the engine.
_SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=())
_BROKEN_TEXT = st.text(st.one_of(st.characters(), _SURROGATES), min_size=1, max_size=12)
_TEXT = st.sampled_from([False] * 7 + [True]).flatmap(
    lambda broken: _BROKEN_TEXT if broken else st.text(max_size=40)
)
_PROMPT_IDS = st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=1, max_size=40)
_PAST_VOCABULARY = st.sampled_from([VOCAB_SIZE, 2**32 - 1, 2**32, 2**64])
_PROMPT = st.one_of(  # one token-id prompt in eight with an id past the vocabulary
    _TEXT.filter(bool),
    st.sampled_from([False] * 7 + [True]).flatmap(
        lambda past: (
            st.tuples(_PROMPT_IDS, _PAST_VOCABULARY).map(lambda t: [*t[0], t[1]])
            if past
            else _PROMPT_IDS
        )
    ),
)
_MAX_TOKENS = st.integers(1, 24)
_SAMPLING = {
    "n": st.one_of(st.integers(1, 4), st.sampled_from([MAX_N, MAX_N + 1])),
    "temperature": st.one_of(st.none(), st.floats(0.0, 2.0)),
    "top_p": st.floats(0.0, 1.0, exclude_min=True),
    "top_k": st.integers(-1, VOCAB_SIZE + 10),
    "min_p": st.floats(0.0, 1.0),
    "seed": _SEEDS,
    "stop": st.one_of(_TEXT, st.lists(_TEXT, max_size=64)),
    "stop_token_ids": st.lists(st.integers(0, VOCAB_SIZE + 10), max_size=8),
    "min_tokens": st.integers(0, 12),
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "return_tokens_as_token_ids": st.booleans(),
    "presence_penalty": st.floats(-2.0, 2.0),
    "frequency_penalty": st.floats(-2.0, 2.0),
    "repetition_penalty": st.floats(0.0, 1e6, exclude_min=True),
    "user": _TEXT,
}
_COMPLETION = _SAMPLING | {
    "max_tokens": _MAX_TOKENS,
    "logprobs": st.integers(0, MAX_LOGPROBS),
    "echo": st.booleans(),
}
_CHAT = _SAMPLING | {
    "max_tokens": _MAX_TOKENS,
    "max_completion_tokens": _MAX_TOKENS,
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, MAX_LOGPROBS),
}
_MESSAGE = st.fixed_dictionaries(
    {  # mostly "user"; every role of the model, the refused ones too
        "role": st.one_of(
            st.just("user"), st.sampled_from(ChatMessage.model_fields["role"].annotation.__args__)
        )
    },
    optional={
        "content": st.one_of(
            _TEXT, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}))
        ),
        "name": _TEXT,
    },
)
_KNOWN = CompletionRequest.model_fields.keys() | ChatCompletionRequest.model_fields.keys()
_EXTRA = st.dictionaries(  # unknown fields, sent with one request in ten
    _TEXT.filter(lambda k: k not in _KNOWN),
    st.one_of(st.none(), st.integers(), _TEXT),
    min_size=1,
    max_size=2,
)


@st.composite
def engine_requests(draw: st.DrawFn, model: str = MODEL) -> tuple[str, dict[str, Any]]:
    """(path, JSON body): a well-formed request, or one a field away, with extreme but legal
    values that reach the engine; the fields and bounds are those of ``protocol.py``;
    ``max_tokens`` stays at most 24 so a request is short."""
    chat = draw(st.booleans())
    fields = _CHAT if chat else _COMPLETION
    body: dict[str, Any] = {"model": model}
    body["messages" if chat else "prompt"] = draw(
        st.lists(_MESSAGE, min_size=1, max_size=3) if chat else _PROMPT
    )
    for name in draw(st.sets(st.sampled_from(sorted(fields)), max_size=8)):
        body[name] = draw(fields[name])
    if chat and body.get("top_logprobs"):
        body["logprobs"] = True
    body.setdefault("max_completion_tokens" if chat else "max_tokens", draw(_MAX_TOKENS))
    if draw(st.booleans()):
        body["stream"] = True
        body["stream_options"] = {"include_usage": draw(st.booleans())}
    if draw(st.sampled_from(range(10))) == 9:
        body |= draw(_EXTRA)
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


# --- constrained requests: structured outputs and tools --------------------------------------

LIMITS = RequestLimits()  # the constrained server's bounds; hostile values sit at and past them
REPEAT = LIMITS.max_regex_repeat
CONSTRAINED_MAX_BODY = 2 << 20  # room for a constraint past max_constraint_bytes
CONSTRAINED_MAX_SEQ_LEN = 1024  # the tools' instructions alone take hundreds of tiny tokens
_NAME = st.text("abxyz_", min_size=1, max_size=3)
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-99, 99), st.text("ab 1", max_size=3))
_BOUND = st.one_of(st.integers(-9, 9), st.sampled_from([0.5, -2.25]))
# Regexes that mean the same in Rust's syntax (llguidance's) and Python's.
_REGEX = st.recursive(
    st.sampled_from(["a", "b", "xy", "0", "[a-c]", "[0-9]", "."]),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map("({0[0]}|{0[1]})".format),
        st.tuples(inner, st.sampled_from(["?", "*", "+", "*?", "{2}", "{1,3}", "{0,2}"])).map(
            "({0[0]}){0[1]}".format
        ),
    ),
    max_leaves=6,
)
_HOSTILE_REGEX = st.one_of(
    st.sampled_from(
        [
            f"a{{{REPEAT}}}",
            f"a{{{REPEAT + 1}}}",
            "a{1000000}",
            f"(a{{{REPEAT}}}){{{REPEAT}}}",
            f"[a-z]{{{REPEAT},}}",
        ]
        + [f".{{0,{REPEAT}}}x", "(a|aa)*b", "(a*)*b", "\\p{Greek}+", "(?=a)a", "(a)\\1", "[", "("]
        + ["a{2,1}", "[z-a]", "a**", "\\", "[[:alpha:]]+", "[a&&b]", "(?i)AB|ab", "^a$", ""]
        + ["\\d+", "\\w{3}", "[^a]*"]
    ),
    st.text("()[]{}*+?|\\^$.-,:ab1", min_size=1, max_size=12),
    st.text(min_size=1, max_size=8),
)
# Grammar pieces as (Lark, GBNF, Python regex of the same language).
_GRAMMAR_ATOMS = st.sampled_from(
    [('"a"', '"a"', "a"), ('"xy"', '"xy"', "xy"), ('"0"', '"0"', "0")]
    + [("/[a-c]/", "[a-c]", "[a-c]"), ("/[0-9]+/", "[0-9]+", "[0-9]+")]
)
_GRAMMAR_EXPR = st.recursive(
    _GRAMMAR_ATOMS,
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(
            lambda p: (
                f"{p[0][0]} {p[1][0]}",
                f"{p[0][1]} {p[1][1]}",
                f"(?:{p[0][2]})(?:{p[1][2]})",
            )
        ),
        st.tuples(inner, inner).map(
            lambda p: (
                (f"({p[0][0]} | {p[1][0]})", f"({p[0][1]} | {p[1][1]})")
                + (f"(?:{p[0][2]}|{p[1][2]})",)
            )
        ),
        st.tuples(inner, st.sampled_from("?*+")).map(
            lambda p: (f"({p[0][0]}){p[1]}", f"({p[0][1]}){p[1]}", f"(?:{p[0][2]}){p[1]}")
        ),
    ),
    max_leaves=5,
)
_RECURSIVE_REQUIRED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
_GRAMMAR_WORDS = ["start", "root", ":", "::=", "|", "(", ")", "*", "+", "?", '"a"', '""', "/a+/"]
_GRAMMAR_WORDS += [
    "/(/",
    "[a-z]",
    "[^]",
    "~",
    "{2,3}",
    f"{{{REPEAT + 1}}}",
    f"~{REPEAT}",
    "%ignore",
    "x",
]
_GRAMMAR_WORDS += ["%import common.WS", "%json", "{}", "@x", "<[1]>", "\n", "x:", ".", "\\"]
_HOSTILE_GRAMMAR = st.one_of(
    st.sampled_from(
        [
            "start: start",
            "root ::= root",
            'start: "a" start',
            'root ::= "a" root',
            "start: x\nx: start",
        ]
        + [f'start: "a"~{REPEAT}', f'start: "a"~{REPEAT + 1}', f'root ::= "a"{{{REPEAT + 1}}}']
        + [f"start: /a{{{REPEAT}}}/", "root ::= [", 'start: "', "start: /(/", "%ignore /x/"]
        + ['start: ""', "root ::= [^]*", "start: %json " + json.dumps(_RECURSIVE_REQUIRED)]
    ),
    st.lists(st.sampled_from(_GRAMMAR_WORDS), min_size=1, max_size=12).map(" ".join),
    st.text(max_size=30),
)
_CHOICES = st.lists(
    st.one_of(st.text(min_size=1, max_size=6), st.sampled_from(["a", "ab", "ä b"])), min_size=1
)
_HOSTILE_CHOICES = st.one_of(
    st.lists(st.one_of(st.text(max_size=6), st.sampled_from(["", "a"])), max_size=10),
    st.sampled_from([LIMITS.max_choices, LIMITS.max_choices + 1]).map(
        lambda k: [str(i) for i in range(k)]
    ),
    st.sampled_from([1, 1000]).map(lambda k: ["a" * 1000] * k),  # 1000: just under 1 MiB
)


@st.composite
def _grammars(draw: st.DrawFn) -> str:
    """A Lark or GBNF grammar (a start rule, perhaps with a recursive list rule), its language
    stated as a Python regex in its first line, a comment: `constraint_problem`'s oracle."""
    lark, gbnf, language = draw(_GRAMMAR_EXPR)
    if draw(st.booleans()):
        item = draw(_GRAMMAR_EXPR)
        lark += f" item\nitem: {item[0]} | {item[0]} item"
        gbnf += f" item\nitem ::= {item[1]} | {item[1]} item"
        language = f"(?:{language})(?:{item[2]})+"
    if draw(st.booleans()):
        return f"// language: {language}\nstart: {lark}\n"
    return f"# language: {language}\nroot ::= {gbnf}\n"


@st.composite
def _objects(draw: st.DrawFn, inner: st.SearchStrategy[dict]) -> dict[str, Any]:
    properties = draw(st.dictionaries(_NAME, inner, max_size=3))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if draw(st.booleans()):  # "zz": required, perhaps without a property of that name
        names = sorted({*properties, "zz"})
        schema["required"] = draw(st.lists(st.sampled_from(names), unique=True, max_size=3))
    if draw(st.booleans()):
        schema["additionalProperties"] = draw(st.one_of(st.booleans(), inner))
    return schema


def _schema_nodes(refs: list[str]) -> st.SearchStrategy[dict]:
    leaves = [
        st.fixed_dictionaries(
            {"type": st.just("string")},
            optional={  # a pattern is searched for: anchored, it is the whole string
                "minLength": st.integers(0, 3),
                "maxLength": st.integers(0, 6),
                "pattern": _REGEX | _REGEX.map("^{}$".format),
            },
        ),
        st.fixed_dictionaries(
            {"type": st.just("integer")},
            optional={
                **dict.fromkeys(
                    ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"], _BOUND
                ),
                "multipleOf": st.integers(1, 4),
            },
        ),
        st.fixed_dictionaries(
            {"type": st.just("number")}, optional=dict.fromkeys(["minimum", "maximum"], _BOUND)
        ),
        st.sampled_from([{"type": "boolean"}, {"type": "null"}, {}]),
        st.lists(_SCALAR, min_size=1, max_size=4).map(lambda v: {"enum": v}),
        _SCALAR.map(lambda v: {"const": v}),
        *([st.sampled_from(refs).map(lambda r: {"$ref": r})] if refs else []),
    ]

    def nested(inner: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
        bounds = {"minItems": st.integers(0, 2), "maxItems": st.integers(0, 3)}
        return st.one_of(
            _objects(inner),
            st.fixed_dictionaries({"type": st.just("array"), "items": inner}, optional=bounds),
            st.fixed_dictionaries(
                {"type": st.just("array"), "prefixItems": st.lists(inner, min_size=1, max_size=2)},
                optional={"items": st.just(False)},
            ),
            st.lists(inner, min_size=1, max_size=3).map(lambda s: {"anyOf": s}),
            st.lists(inner, min_size=1, max_size=2).map(lambda s: {"allOf": s}),
            st.lists(inner, min_size=2, max_size=2).map(lambda s: {"oneOf": s}),
        )

    return st.recursive(st.one_of(leaves), nested, max_leaves=6)


# A strategy of our own, not hypothesis-jsonschema's ``from_schema`` over a meta-schema: that
# cannot follow a recursive ``$ref`` (a schema's subschemas are schemas), and a meta-schema
# cannot make a ``$ref`` name a definition that exists.
@st.composite
def schemas(draw: st.DrawFn) -> dict[str, Any]:
    """A JSON schema of the kinds above; about half with definitions (``$defs``, or draft 7's
    ``definitions``) that refer to each other, to themselves and to the root ``#``."""
    names = draw(st.lists(_NAME, unique=True, max_size=2))
    keyword = draw(st.sampled_from(["$defs", "definitions"]))
    refs = [f"#/{keyword}/{n}" for n in names] + (["#"] if names else [])
    nodes = _schema_nodes(refs)
    schema = draw(nodes)
    if names:
        schema = {**schema, keyword: {n: draw(nodes) for n in names}}
    return schema


def _nest(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def _wide_object(num_properties: int) -> dict[str, Any]:
    names = [f"p{i}" for i in range(num_properties)]
    properties = dict.fromkeys(names, {"type": "integer"})
    return {"type": "object", "properties": properties, "required": names}


_HOSTILE_SCHEMAS = st.sampled_from(
    [
        {"type": "string", "minLength": 10**6},
        {"type": "string", "maxLength": 2**64},
        {"type": "array", "minItems": 10**6},
        {"type": "array", "items": {"type": "integer"}, "maxItems": 2**64},
        {"type": "integer", "minimum": 2**70},
        {"type": "integer", "minimum": 5, "maximum": 1},
        {"type": "number", "exclusiveMinimum": 1e308},
        {"type": "string", "pattern": f"a{{{REPEAT}}}"},
        {"type": "string", "pattern": f"a{{{REPEAT + 1}}}"},
        {"type": "string", "pattern": "(a"},
        _RECURSIVE_REQUIRED,
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"$ref": "#"},
        {"$ref": "#/$defs/missing"},
        {"$ref": "#/properties/0"},
        {"$ref": "other.json"},
        {"$ref": "https://example.com/s.json#/a"},
        {"$ref": "urn:x"},
        {"$id": "http://x.test/", "$ref": "y"},
        {"$anchor": "a", "type": "object", "properties": {"x": {"$ref": "#a"}}},
        {"$schema": "http://json-schema.org/draft-07/schema#", "$ref": "#/definitions/a"}
        | {"definitions": {"a": {"type": "integer"}}, "type": "string"},
        {"not": {"type": "string"}},
        {"if": {"type": "string"}, "then": {"minLength": 2}},
        {"type": "array", "uniqueItems": True},
        {"type": "array", "contains": {"type": "integer"}},
        {"type": "object", "dependentRequired": {"a": ["b"]}},
        {"type": "object", "propertyNames": {"maxLength": 1}},
        {"type": "string", "format": "date-time"},
        {"type": "junk"},
        {"type": []},
        {"minLength": -1},
        {"enum": []},
        _nest(64),
        _nest(400),
        {"enum": ["a" * 1000] * 1000},  # just under max_constraint_bytes
        _wide_object(15_000),  # 590 KB, seconds to compile; llguidance refuses 18,000 ("too large")
        {"enum": ["a" * 1000] * 1100},  # just over
    ]
)
_UNKNOWN_KEYWORDS = st.dictionaries(
    st.one_of(
        st.sampled_from(
            ["x-extra", "nullable", "discriminator", "$comment", "deprecated", "title"]
        ),
        st.text(min_size=1, max_size=8),
    ),
    st.one_of(_SCALAR, st.dictionaries(_NAME, _SCALAR, max_size=2)),
    min_size=1,
    max_size=2,
)


@st.composite
def hostile_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """A generated schema with a hostile fragment (`_HOSTILE_SCHEMAS`, or unknown keywords)
    merged into its root or as a required property, or the fragment alone."""
    fragment = draw(st.one_of(_HOSTILE_SCHEMAS, _UNKNOWN_KEYWORDS))
    schema = draw(schemas())
    where = draw(st.sampled_from(["alone", "root", "property"]))
    if where == "alone":
        return fragment
    if where == "root":
        return schema | fragment
    properties = schema.get("properties", {}) | {"h": fragment}
    return schema | {"type": "object", "properties": properties, "required": ["h"]}


def _constraints(
    json_schemas: st.SearchStrategy,
    regexes: st.SearchStrategy,
    choices: st.SearchStrategy,
    grammars: st.SearchStrategy,
) -> st.SearchStrategy[dict[str, Any]]:
    """One constraint: ``{"response_format": ...}`` or ``{"structured_outputs": ...}``."""

    def json_schema(schema: Any, strict: bool | None) -> dict[str, Any]:
        named = {"name": "fuzz", "schema": schema} | ({} if strict is None else {"strict": strict})
        return {"response_format": {"type": "json_schema", "json_schema": named}}

    return st.one_of(
        st.builds(json_schema, json_schemas, st.one_of(st.none(), st.booleans())),
        st.just({"response_format": {"type": "json_object"}}),
        st.just({"structured_outputs": {"json_object": True}}),
        json_schemas.map(lambda s: {"structured_outputs": {"json": s}}),
        json_schemas.map(lambda s: {"structured_outputs": {"json": json.dumps(s)}}),
        regexes.map(lambda r: {"structured_outputs": {"regex": r}}),
        choices.map(lambda c: {"structured_outputs": {"choice": c}}),
        grammars.map(lambda g: {"structured_outputs": {"grammar": g}}),
    )


_CONSTRAINTS = _constraints(schemas(), _REGEX, _CHOICES, _grammars())
_HOSTILE_CONSTRAINTS = st.one_of(
    _constraints(hostile_schemas(), _HOSTILE_REGEX, _HOSTILE_CHOICES, _HOSTILE_GRAMMAR),
    st.sampled_from(
        [
            {"structured_outputs": {}},
            {"structured_outputs": {"regex": "a", "choice": ["a"]}},
            {"structured_outputs": {"json": "{not json"}},
            {"structured_outputs": {"json": "5"}},
            {"structured_outputs": {"json_object": False}},
            {"structured_outputs": {"pattern": "a"}},
            {"response_format": {"type": "json_schema"}},
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x" * 65}}},
            {"response_format": {"type": "text", "json_schema": {"name": "x", "schema": {}}}},
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        ]
    ),
)
# Legal sampling fields (the engine fuzzing sends the illegal ones): how a constraint meets
# min_tokens, ignore_eos, stop strings, several choices and penalties.
_CONSTRAINED_SAMPLING = {
    name: _SAMPLING[name] for name in ("temperature", "top_p", "top_k", "ignore_eos")
} | {
    "min_tokens": st.integers(0, 4),
    "n": st.integers(1, 3),
    "seed": st.integers(0, 2**64 - 1),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=4),
    "presence_penalty": st.floats(-2.0, 2.0),
}
_ASK = st.text(max_size=20).map(lambda text: [{"role": "user", "content": text}])


def _constrained_body(
    draw: st.DrawFn, model: str, chat: bool, fields: dict, max_tokens: int = 150
) -> dict[str, Any]:
    """A short request with ``fields``, a few sampling fields and up to ``max_tokens`` new
    tokens (room for most constrained outputs to end on their own), whole or streamed."""
    body = {"model": model} | fields
    if not chat:
        body["prompt"] = draw(st.text(min_size=1, max_size=20))
    for name in draw(st.sets(st.sampled_from(sorted(_CONSTRAINED_SAMPLING)), max_size=4)):
        body[name] = draw(_CONSTRAINED_SAMPLING[name])
    body["max_completion_tokens" if chat else "max_tokens"] = draw(
        st.integers(max_tokens // 3, max_tokens) | st.integers(1, 4)
    )
    if draw(st.booleans()):
        body["stream"] = True
        body["stream_options"] = {"include_usage": draw(st.booleans())}
    return body


@st.composite
def constrained_requests(
    draw: st.DrawFn, model: str = MODEL, hostile: bool = False
) -> tuple[str, dict[str, Any]]:
    """(path, JSON body): a completion or chat request with one generated constraint
    (`_CONSTRAINTS`), or with ``hostile`` a hostile one (`_HOSTILE_CONSTRAINTS`)."""
    fields = draw(_HOSTILE_CONSTRAINTS if hostile else _CONSTRAINTS)
    if draw(st.booleans()):
        return "/v1/chat/completions", _constrained_body(
            draw, model, True, fields | {"messages": draw(_ASK)}
        )
    return "/v1/completions", _constrained_body(draw, model, False, fields)


@st.composite
def tool_requests(
    draw: st.DrawFn, model: str = MODEL, hostile: bool = False
) -> tuple[str, dict[str, Any]]:
    """(path, JSON body): a chat request offering one to three functions whose parameters are
    generated schemas (with ``hostile``: hostile ones, repeated and odd names, a constraint
    beside the tools), with every ``tool_choice`` (none, auto, required, a function by name,
    unset) and ``parallel_tool_calls`` either way or unset."""
    names = ["get_a", "b", "c-1"]
    names = st.sampled_from(names * 4 + ["", "a b", "x" * 65, "é"] if hostile else names)
    parameters = st.one_of(
        st.none(),
        schemas().map(lambda s: {"type": "object", "properties": {"p": s}, "required": ["p"]}),
        schemas(),
        *([hostile_schemas()] * 3 if hostile else []),
    )
    tools = [
        {"type": "function", "function": {"name": name, "parameters": draw(parameters)}}
        for name in draw(st.lists(names, min_size=1, max_size=3, unique=not hostile))
    ]
    fields: dict[str, Any] = {"messages": draw(_ASK), "tools": tools}
    choice = draw(st.sampled_from(["none", "auto", "required", "named", "unset"]))
    if choice == "named":
        name = draw(st.sampled_from([t["function"]["name"] for t in tools] + ["other"] * hostile))
        fields["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif choice != "unset":
        fields["tool_choice"] = choice
    if draw(st.booleans()):
        fields["parallel_tool_calls"] = draw(st.booleans())
    if hostile and draw(st.booleans()):
        fields |= draw(_CONSTRAINTS)
    return "/v1/chat/completions", _constrained_body(draw, model, True, fields, 300)


def constraint_problem(body: dict[str, Any], content_type: str, text: str) -> str | None:
    """What is wrong with a 200's output under the request's constraint, or None. A choice that
    ended on its own (finish reason ``stop``, no stop string or stop token in the request)
    must satisfy it: JSON valid against the schema (``jsonschema``), one of the choices, a
    full match of the regex where Python reads it as Rust does (`_python_regex`), of a
    generated grammar's stated language. With tools to call, ``tool_calls`` must name offered
    functions (the named one), one unless ``parallel_tool_calls``, their arguments valid
    against the parameters; and ``tool_choice`` required or named cannot end in text."""
    if body.get("stop") or body.get("stop_token_ids"):
        return None
    tools, tool_choice = body.get("tools"), body.get("tool_choice")
    check = None if tools and tool_choice != "none" else _output_check(body)
    for output, finish_reason, calls in _choices(content_type, text):
        if finish_reason == "tool_calls" and tools:
            functions = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
            if isinstance(tool_choice, dict):
                functions = {
                    tool_choice["function"]["name"]: functions[tool_choice["function"]["name"]]
                }
            if not calls or (len(calls) > 1 and body.get("parallel_tool_calls") is False):
                return f"{len(calls)} tool calls: {calls}"
            for name, arguments in calls:
                if name not in functions:
                    return f"a call of {name!r}, not among {sorted(functions)}"
                problem = _json_problem(arguments, functions[name] or {"type": "object"})
                if problem:
                    return f"{name}'s arguments: {problem}"
        elif finish_reason == "stop" and tools and tool_choice not in (None, "none", "auto"):
            return f"tool_choice {tool_choice!r} answered with text: {output!r}"
        elif finish_reason == "stop" and check is not None and (problem := check(output)):
            return problem
    return None


def _output_check(body: dict[str, Any]) -> Callable[[str], str | None] | None:
    """The check of a finished output under the request's constraint, or None (none, or one
    this fuzzing cannot judge)."""
    so, rf = body.get("structured_outputs"), body.get("response_format")
    if isinstance(so, dict) and len(so) == 1:
        ((kind, value),) = so.items()
        if kind == "json_object":
            return lambda output: _json_problem(output, {"type": "object"})
        if kind == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            return lambda output: _json_problem(output, schema)
        if kind == "choice":
            return lambda output: None if output in value else f"{output!r} is not a choice"
        pattern = _python_regex(value) if kind == "regex" else _stated_language(value)
        if pattern is not None:
            return lambda output: (
                None if pattern.fullmatch(output) else f"{output!r} does not match"
            )
    elif isinstance(rf, dict) and rf.get("type") == "json_object":
        return lambda output: _json_problem(output, {"type": "object"})
    elif isinstance(rf, dict) and rf.get("type") == "json_schema":
        return lambda output: _json_problem(output, rf["json_schema"].get("schema") or {})
    return None


def _json_problem(output: str, schema: Any) -> str | None:
    """What is wrong with ``output`` as a JSON value of ``schema``; None also when
    ``jsonschema`` finds ``schema`` itself invalid (the server may read it leniently)."""
    try:
        value = json.loads(output)
    except ValueError:
        return f"not JSON: {output!r}"
    validator = jsonschema.validators.validator_for(schema)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    try:
        error = jsonschema.exceptions.best_match(validator(schema).iter_errors(value))
    except referencing.exceptions.Unresolvable as exc:
        return f"{output!r} generated under a schema whose $ref cannot be followed: {exc!r}"
    except RecursionError:  # a left-recursive $ref (anyOf: [{$ref: "#"}, ...]): jsonschema
        return None  # recurses without end on it, llguidance does not; not checkable here
    return None if error is None else f"{output!r} breaks the schema: {error.message}"


# Rust-regex text that Python reads the same way: these characters, no inline flags, no
# possessive quantifier (Python 3.11's), no blank in a counted repetition. No Unicode class
# (\d, \w): Python 3.11's tables are Unicode 14, Rust's regex crate's are newer (U+1CCF6 is a
# digit to one and unassigned to the other).
_SAME_IN_PYTHON = re.compile(r"[A-Za-z0-9 ()|?*+{},.\[\]-]*")
_READ_OTHERWISE = re.compile(r"\(\?|[*+?}]\+|\{[^}]* ")


def _python_regex(regex: str) -> re.Pattern | None:
    """``regex`` as a Python pattern of the same language, or None when it may not be one."""
    if not _SAME_IN_PYTHON.fullmatch(regex) or _READ_OTHERWISE.search(regex):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FutureWarning: a set operation in Rust's syntax
        try:
            return re.compile(regex)
        except (re.error, FutureWarning):
            return None


def _stated_language(grammar: str) -> re.Pattern | None:
    """The language a generated grammar states in its first line (`_grammars`), or None."""
    stated = re.match(r"(?://|#) language: (.*)\n", grammar)
    try:
        return re.compile(stated.group(1)) if stated else None
    except re.error:  # random text that happens to start like a statement
        return None


def _choices(content_type: str, text: str) -> list[tuple[str, str | None, list[tuple[str, str]]]]:
    """Each choice of a 200 as (output text, finish reason, [(function name, arguments)]),
    whole or assembled from a stream's deltas."""
    if not content_type.startswith("text/event-stream"):
        choices = json.loads(text)["choices"]
        return [
            (
                c.get("text", (c.get("message") or {}).get("content")) or "",
                c["finish_reason"],
                [
                    (t["function"]["name"], t["function"]["arguments"])
                    for t in (c.get("message") or {}).get("tool_calls") or []
                ],
            )
            for c in choices
        ]
    outputs: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    calls: dict[int, dict[int, list[str]]] = {}
    for line in text.splitlines():
        event = line.removeprefix("data: ")
        if not line or event == "[DONE]":
            continue
        for c in json.loads(event).get("choices", []):
            delta = c.get("delta") or {}
            outputs.setdefault(c["index"], []).append(c.get("text", delta.get("content")) or "")
            finish[c["index"]] = c.get("finish_reason") or finish.get(c["index"])
            for call in delta.get("tool_calls") or []:
                name_args = calls.setdefault(c["index"], {}).setdefault(call["index"], ["", ""])
                name_args[0] += call["function"].get("name") or ""
                name_args[1] += call["function"].get("arguments") or ""
    return [
        (
            "".join(outputs[i]),
            finish.get(i),
            [tuple(a) for _, a in sorted(calls.get(i, {}).items())],
        )
        for i in sorted(outputs)
    ]


def post_and_check(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[str, str | None]:
    """POST ``body`` (``ensure_ascii`` JSON: lone surrogates travel as escapes); returns the
    status (or ``hang``, ``dropped``) and what went wrong, or None: see `response_problem` and,
    for a 200, `constraint_problem`; no answer in ``client``'s timeout; the connection dropped,
    during the request or right after it (a ``GET /health`` on the same keep-alive connection
    must answer)."""
    try:
        response = client.post(path, content=json.dumps(body).encode(), headers=JSON)
    except httpx.TimeoutException:
        return "hang", "no answer: the server hangs"
    except httpx.TransportError as exc:
        return "dropped", f"connection dropped without a response: {exc!r}"
    status = str(response.status_code)
    content_type = response.headers.get("content-type", "")
    problem = response_problem(response.status_code, content_type, response.text)
    if problem is None and response.status_code == 200:
        problem = constraint_problem(body, content_type, response.text)
    try:
        client.get("/health")
    except httpx.TransportError as exc:
        dropped = f"{DROPPED_AFTER} {status} response: {exc!r}"
        problem = f"{problem}\n{dropped}" if problem else dropped
    return status, problem


# --- the tests -------------------------------------------------------------------------------


def build_engine(root: Path, max_seq_len: int) -> Path:
    """The tests' tiny Llama (2 layers, hidden 64, vocabulary 512), built for cpu with block
    size 16 and ``max_seq_len`` under ``root``."""
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from tests.tiny_models import make_tiny_llama

    model = make_tiny_llama(root / "model", max_position_embeddings=max(512, max_seq_len))
    config = BuildConfig.of(
        model=str(model), block_size=16, max_seq_len=max_seq_len, output=str(root / "engine")
    )
    return Path(build(config).engine_dir)


@pytest.fixture(scope="module")
def fuzzed(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    """The server as ``llmc serve`` runs it, with an API key and a small body cap, over 32
    blocks of 16 tokens, so choices of a large ``n`` must wait for or preempt one another."""
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    limits = RequestLimits(max_request_body_bytes=MAX_BODY)
    with running_server(engine, MODEL, max_waiting=8, api_key=KEY, limits=limits) as server:
        yield server


@pytest.fixture(scope="module")
def constrained(
    tmp_path_factory: pytest.TempPathFactory, running_server: ServerFactory
) -> Iterator[LiveServer]:
    """The server for constrained requests: a context of `CONSTRAINED_MAX_SEQ_LEN` tokens over
    96 blocks, the default constraint bounds and a body cap that lets a constraint past them
    through."""
    from llmc.runtime.engine import LLMEngine

    engine_dir = build_engine(tmp_path_factory.mktemp("constrained"), CONSTRAINED_MAX_SEQ_LEN)
    engine = LLMEngine.from_engine_dir(engine_dir, num_blocks=96)
    limits = RequestLimits(max_request_body_bytes=CONSTRAINED_MAX_BODY)
    with running_server(engine, MODEL, max_waiting=8, api_key=KEY, limits=limits) as server:
        yield server


@pytest.fixture(scope="module")
def openapi(fuzzed: LiveServer) -> schemathesis.BaseSchema:
    schema = openapi_schema(fuzzed.url, MODEL, KEY)
    schema.config.generation.update(
        modes=list(schemathesis.GenerationMode), max_examples=100, deterministic=True
    )
    schema.config.phases.update(phases=["examples", "coverage", "fuzzing"])
    return schema


def _client(server: LiveServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=HANG_S, headers=AUTH)


@pytest.fixture(scope="module")
def http(fuzzed: LiveServer) -> Iterator[httpx.Client]:
    with _client(fuzzed) as client:
        yield client


@pytest.fixture(scope="module")
def constrained_http(constrained: LiveServer) -> Iterator[httpx.Client]:
    with _client(constrained) as client:
        yield client


schema = schemathesis.pytest.from_fixture("openapi")


@schema.parametrize()
@settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_schema_fuzzing_gets_no_5xx_and_no_hang(case: schemathesis.Case) -> None:
    try:
        response = case.call_and_validate(checks=SCHEMA_CHECKS, timeout=HANG_S)
    except requests.Timeout as exc:
        raise AssertionError(f"no answer in {HANG_S} s: {case.as_curl_command()}") from exc
    if response.stream_cut_short:  # schemathesis stopped reading: HANG_S passed in total
        raise AssertionError(f"no end of stream in {HANG_S} s: {case.as_curl_command()}")
    content_type = response.headers.get("content-type", [""])[0]  # schemathesis: name -> list
    problem = response_problem(response.status_code, content_type, response.text, case.path)
    assert problem is None, f"{problem}\n{case.as_curl_command()}"


# Requests the generators reach only rarely, sent before the generated ones: a prompt id past
# 32 bits with echo (the echo decodes the prompt); tool calls with parallel_tool_calls false
# and tool_choice unset (on the tiny engine this seed makes three calls where one is allowed).
_NOTHING = {"type": "object", "additionalProperties": False}
ENGINE_EDGES = [("/v1/completions", {"model": MODEL, "prompt": [2**32], "echo": True})]
TOOL_EDGES = [
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": _NOTHING}}],
            "parallel_tool_calls": False,
            "seed": 16,
            "max_tokens": 100,
        },
    )
]


def _fuzz(
    client: httpx.Client,
    strategy: st.SearchStrategy,
    examples: int,
    edges: list[tuple[str, dict[str, Any]]] | None = None,
) -> None:
    """Send ``edges``, then ``examples`` draws of ``strategy``, and fail on the first problem
    (`post_and_check`), shrunk to a small request."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def check(request: tuple[str, dict[str, Any]]) -> None:
        path, body = request
        _, problem = post_and_check(client, path, body)
        assert problem is None, f"{problem}\nPOST {path} {json.dumps(body)[:4000]}"

    for edge in edges or []:
        check = example(edge)(check)
    check()


def _answer(content: str, finish_reason: str = "stop", calls: tuple = ()) -> str:
    tool_calls = [{"function": {"name": n, "arguments": a}} for n, a in calls]
    message = {"content": content, "tool_calls": tool_calls or None}
    return json.dumps(
        {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}
    )


_OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
_TOOLS = {"tools": [{"type": "function", "function": {"name": "f", "parameters": _OBJECT}}]}
_STREAM = (
    "".join(
        f"data: {json.dumps({'choices': [{'index': 0, 'text': t, 'finish_reason': f}]})}\n\n"
        for t, f in [('{"a"', None), (': "x"}', "stop")]
    )
    + "data: [DONE]\n\n"
)


@pytest.mark.parametrize(
    ("fields", "content_type", "text", "wrong"),
    [
        (
            {"structured_outputs": {"json": _OBJECT}},
            JSON["content-type"],
            _answer('{"a": 1}'),
            False,
        ),
        (
            {"structured_outputs": {"json": _OBJECT}},
            JSON["content-type"],
            _answer('{"a": ""}'),
            True,
        ),
        ({"structured_outputs": {"json": _OBJECT}}, "text/event-stream", _STREAM, True),
        (
            {"structured_outputs": {"json": _OBJECT}, "stop": ["}"]},
            "text/event-stream",
            _STREAM,
            False,
        ),
        (
            {"structured_outputs": {"json": _OBJECT}},
            JSON["content-type"],
            _answer("{", "length"),
            False,
        ),
        ({"response_format": {"type": "json_object"}}, JSON["content-type"], _answer("[]"), True),
        ({"structured_outputs": {"choice": ["a", "b"]}}, JSON["content-type"], _answer("ab"), True),
        ({"structured_outputs": {"regex": "(ab)+"}}, JSON["content-type"], _answer("aba"), True),
        (
            {"structured_outputs": {"regex": "(?i)(ab)+"}},
            JSON["content-type"],
            _answer("aba"),
            False,
        ),
        (
            {"structured_outputs": {"grammar": '# language: a+\nroot ::= "a"+\n'}},
            JSON["content-type"],
            _answer("b"),
            True,
        ),
        (_TOOLS | {"tool_choice": "required"}, JSON["content-type"], _answer("hi"), True),
        (_TOOLS, JSON["content-type"], _answer("hi"), False),
        (_TOOLS, JSON["content-type"], _answer("", "tool_calls", [("f", '{"a": 1}')]), False),
        (_TOOLS, JSON["content-type"], _answer("", "tool_calls", [("g", '{"a": 1}')]), True),
        (_TOOLS, JSON["content-type"], _answer("", "tool_calls", [("f", '{"b": 1}')]), True),
        (
            _TOOLS | {"parallel_tool_calls": False},
            JSON["content-type"],
            _answer("", "tool_calls", [("f", '{"a": 1}')] * 2),
            True,
        ),
    ],
)
def test_constraint_problem_finds_outputs_that_break_their_constraint(
    fields: dict[str, Any], content_type: str, text: str, wrong: bool
) -> None:
    """The fuzzing's oracle on made-up answers: it must be able to fail."""
    problem = constraint_problem({"model": MODEL} | fields, content_type, text)
    assert (problem is not None) == wrong, problem


def test_engine_fuzzing_gets_no_5xx_and_no_hang(http: httpx.Client) -> None:
    _fuzz(http, engine_requests(), 150, ENGINE_EDGES)


def test_constrained_outputs_satisfy_their_constraints(constrained_http: httpx.Client) -> None:
    _fuzz(constrained_http, constrained_requests(), 60)


def test_hostile_constraints_get_a_400_not_a_5xx_or_a_hang(
    constrained_http: httpx.Client,
) -> None:
    _fuzz(constrained_http, constrained_requests(hostile=True), 60)


def test_tool_calls_call_the_tools_with_valid_arguments(constrained_http: httpx.Client) -> None:
    _fuzz(constrained_http, st.one_of(tool_requests(), tool_requests(hostile=True)), 40, TOOL_EDGES)


@pytest.mark.parametrize("server_name", ["fuzzed", "constrained"])
def test_after_fuzzing_the_server_serves_and_every_block_is_free(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    """Runs after the fuzzing above (pytest keeps the file's order)."""
    server: LiveServer = request.getfixturevalue(server_name)
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 4, "ignore_eos": True}
    with _client(server) as http:
        ok = http.post("/v1/completions", json=body)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4, ok.text
        assert http.get("/health").status_code == 200
        engine = server.engine

        def pool_is_free() -> bool:
            stats = engine.stats
            return stats.num_free_blocks == stats.num_total_blocks and stats.num_running == 0

        _wait_until(pool_is_free, "every block is back in the pool")
        text = http.get("/metrics").text
    metrics = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0
    assert metrics["vllm:num_requests_running"] == metrics["vllm:num_requests_waiting"] == 0
