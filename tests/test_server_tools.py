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
    from llmc.compiler.build_config import BuildConfig
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


@pytest.mark.parametrize(
    "extra, reason",
    [
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "'nope'",
        ),
        ({"tools": TOOLS + TOOLS[:1]}, "unique"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "cannot be combined"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "pattern"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}
                ]
            },
            "strin",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
    ],
)
def test_bad_tool_requests_are_400s(served, extra, reason):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4} | extra
    r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert reason in r.json()["error"]["message"]


def test_tool_choice_none_answers_in_text(client):
    choice = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
    ).choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
