"""Tool calling through the real server and the official ``openai`` client, on the tiny engine
(random weights: the grammar makes every call parse whatever the model prefers)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

MODEL = "tiny-llama"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["utc", "cet"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def tools_engine(tmp_path_factory) -> Path:
    """A tiny Llama with room for the tools' instructions (its 512-token vocabulary spells
    them in hundreds of tokens)."""
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from tests.tiny_models import make_tiny_llama

    root = tmp_path_factory.mktemp("tools")
    ckpt = make_tiny_llama(root / "ckpt", max_position_embeddings=2048)
    config = BuildConfig.of(
        model=str(ckpt), block_size=16, max_seq_len=2048, output=str(root / "e")
    )
    return Path(build(config).engine_dir)


@pytest.fixture(scope="module")
def served(tools_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tools_engine, num_blocks=256)
    with running_server(engine, MODEL, max_waiting=32) as server:
        yield server


@pytest.fixture
def client(served: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def _validate(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_tool_call_parses_and_validates(client):
    for seed in range(6):
        choice = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,  # one call: the output is bounded
            temperature=1.0,
            seed=seed,
            max_tokens=80,
        ).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        _validate(choice.message.tool_calls)


def test_named_function_and_no_parallel_calls(client):
    for seed in range(4):
        choice = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=80,
        ).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
        _validate(choice.message.tool_calls)


def test_auto_answers_with_calls_or_text(client):
    kinds = set()
    for seed in range(12):
        choice = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            temperature=1.0,
            seed=seed,
            max_tokens=80,
        ).choices[0]
        if choice.finish_reason == "tool_calls":
            _validate(choice.message.tool_calls)
            kinds.add("calls")
        elif choice.finish_reason == "stop":
            assert isinstance(choice.message.content, str) and not choice.message.tool_calls
            kinds.add("text")
    assert kinds  # at least one answer ended within max_tokens


def test_streamed_tool_call_assembles_into_the_non_streamed_call(client):
    body = dict(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80
    )
    whole = client.chat.completions.create(**body).choices[0].message.tool_calls
    with client.chat.completions.stream(**body) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    streamed = final.message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in whole
    ]


def test_a_conversation_with_calls_and_tool_results_continues(client):
    messages = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Oslo", "unit": "c"}',
                    },
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": '{"zone": "cet"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3 degrees"},
        {"role": "tool", "tool_call_id": "call_2", "content": "14:00"},
    ]
    choice = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=80,
        temperature=0,
    ).choices[0]
    _validate(choice.message.tool_calls)


NON_LOCAL = {"type": "object", "properties": {"x": {"$ref": "https://example.com/x.json"}}}


@pytest.mark.parametrize(
    "extra, param, reason",
    [
        ({"tool_choice": "required"}, "tool_choice", "tool_choice needs tools"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "'nope'",
        ),
        ({"tools": TOOLS + TOOLS[:1]}, "tools", "unique"),
        (
            {"tools": TOOLS, "response_format": {"type": "json_object"}},
            "response_format",
            "cannot be combined",
        ),
        (
            {"tools": TOOLS, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
            "cannot be combined",
        ),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "pattern"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}
                ]
            },
            "tools",
            "strin",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": NON_LOCAL}}]},
            "tools",
            "https://example.com/x.json",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "tool_call_id"),
    ],
)
def test_bad_tool_requests_are_400s_naming_the_field(served, extra, param, reason):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4} | extra
    r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert reason in error["message"] and error["param"] == param, error


def test_tool_choice_none_answers_in_text(client):
    choice = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
    ).choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls


# --- parameters with local references ($defs, definitions, "#"), as pydantic writes them ----


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false bounds the output

    name: str = Field(max_length=6)
    unit: str = Field(pattern="^[cf]$")


class Trip(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start: City
    stops: list[City] = Field(max_length=1)


TRIP = Trip.model_json_schema()  # {"$defs": {"City": ...}, "properties": {"start": {"$ref"...
# Two tools whose "$defs" both hold a "Value", of different types: each call must use its own.
COUNT = {
    "type": "object",
    "properties": {"n": {"$ref": "#/$defs/Value"}},
    "required": ["n"],
    "additionalProperties": False,
    "$defs": {"Value": {"type": "integer", "minimum": 0, "maximum": 9}},
}
LABEL = {
    "type": "object",
    "properties": {"n": {"$ref": "#/$defs/Value"}},
    "required": ["n"],
    "additionalProperties": False,
    "$defs": {"Value": {"enum": ["low", "high"]}},
}
# A list as nested objects: the parameters refer to their own root (and to draft 7's
# "definitions").
CHAIN = {
    "type": "object",
    "properties": {"digit": {"$ref": "#/definitions/Digit"}, "next": {"$ref": "#"}},
    "required": ["digit"],
    "additionalProperties": False,
    "definitions": {"Digit": {"enum": [0, 1]}},
}


def _tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _calls(client, tools: list[dict], tool_choice: object, seeds: int) -> list[tuple[str, dict]]:
    """The (name, arguments) of the calls of ``seeds`` sampled answers that ended in time."""
    calls = []
    for seed in range(seeds):
        choice = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=tools, tool_choice=tool_choice,
            parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=120,
        ).choices[0]  # fmt: skip
        if choice.finish_reason == "tool_calls":
            (call,) = choice.message.tool_calls
            calls.append((call.function.name, json.loads(call.function.arguments)))
    assert calls  # at least one answer ended within max_tokens
    return calls


def _named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def test_parameters_with_defs_from_a_pydantic_model_validate(client):
    for name, arguments in _calls(client, [_tool("plan_trip", TRIP)], _named("plan_trip"), 4):
        assert name == "plan_trip"
        jsonschema.validate(arguments, TRIP)
        Trip.model_validate(arguments)


def test_two_tools_with_a_definition_of_one_name_each_use_their_own(client):
    schemas = {"count": COUNT, "label": LABEL}
    tools = [_tool(name, schema) for name, schema in schemas.items()]
    for tool_choice in (_named("count"), _named("label"), "required"):
        for name, arguments in _calls(client, tools, tool_choice, 3):
            jsonschema.validate(arguments, schemas[name])


def test_parameters_that_refer_to_their_own_root_validate(client):
    tools = [_tool("chain", CHAIN), _tool("get_time", TIME)]
    for name, arguments in _calls(client, tools, _named("chain"), 4):
        assert name == "chain"
        jsonschema.validate(arguments, CHAIN)
