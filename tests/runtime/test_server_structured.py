"""Structured outputs through the real server and the official ``openai`` client: parsed
pydantic objects, vLLM's ``structured_outputs``, streamed constrained output, and 400s that name
the field for a constraint that cannot be compiled."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

MODEL = "tiny-llama"


class Mood(StrEnum):
    glad = "glad"
    sad = "sad"


class Act(BaseModel):
    n: int = Field(ge=1, le=5)
    end: bool


class Play(BaseModel):
    title: str = Field(max_length=5)
    mood: Mood
    acts: list[Act] = Field(min_length=1, max_length=2)
    author: str | None = Field(max_length=4)
    year: int | bool


@pytest.fixture(scope="module")
def served(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=48)
    with running_server(engine, MODEL, max_waiting=32) as server:
        yield server


@pytest.fixture
def client(served: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def _play_schema() -> dict:
    from openai.lib._pydantic import to_strict_json_schema

    return to_strict_json_schema(Play)


def test_chat_completions_parse_returns_the_pydantic_object(client):
    """Nesting, an enum, a bounded array, an optional field and ``anyOf`` (int | bool), as the
    client's strict schema of a pydantic model; sampled at temperature 1.0."""
    for seed in range(6):
        completion = client.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": "A play?"}],
            response_format=Play,
            temperature=1.0,
            seed=seed,
            max_tokens=120,  # the context is 128; seed 5 writes 111 tokens
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Play)
        jsonschema.validate(json.loads(choice.message.content), _play_schema())


def test_completions_take_vllm_structured_outputs(client):
    pattern = r"[A-Z][a-z]{2,5}, [0-9]{2}"
    for seed in range(4):
        c = client.completions.create(
            model=MODEL,
            prompt="Name and age:",
            max_tokens=40,
            temperature=1.0,
            seed=seed,
            extra_body={"structured_outputs": {"regex": pattern}},
        ).choices[0]
        assert c.finish_reason == "stop" and re.fullmatch(pattern, c.text), c.text
    c = client.completions.create(
        model=MODEL,
        prompt="Pick:",
        max_tokens=20,
        temperature=1.0,
        extra_body={"structured_outputs": {"choice": ["left", "right"]}},
    ).choices[0]
    assert c.text in ("left", "right")


def test_json_object_on_completions(client):
    c = client.completions.create(
        model=MODEL,
        prompt="{",
        max_tokens=60,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},  # OpenAI's is chat-only
    ).choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.text), dict)
    else:  # greedy may run on; what there is still opens an object
        assert c.finish_reason == "length" and c.text.startswith("{")


def test_streamed_constrained_output_is_the_non_streamed_one(client):
    body = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "A play?"}],
        temperature=0,
        max_tokens=100,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "play", "schema": _play_schema(), "strict": True},
        },
    )
    whole = client.chat.completions.create(**body).choices[0].message.content
    stream = client.chat.completions.create(**body, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == whole
    Play.model_validate_json(whole)


@pytest.mark.parametrize(
    "extra, param, reason",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "strin"}},
                }
            },
            "response_format",
            "strin",
        ),
        ({"structured_outputs": {"regex": "[0-9"}}, "structured_outputs", "regex"),
        ({"structured_outputs": {"grammar": "start: nowhere"}}, "structured_outputs", "nowhere"),
        (
            {"structured_outputs": {"whitespace_pattern": " "}},
            "structured_outputs",
            "whitespace_pattern",
        ),
        (
            {"structured_outputs": {"regex": "a", "choice": ["b"]}},
            "structured_outputs",
            "exactly one",
        ),
        (
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            None,
            "not both",
        ),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format",
            "json_schema is required",
        ),
    ],
)
def test_a_bad_constraint_is_a_400_naming_the_field(served, extra, param, reason):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4, **extra}
    r = httpx.post(served.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert reason in error["message"]
    if param is not None:
        assert param in (error.get("param") or error["message"])
    ok = httpx.post(
        served.url + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 2},
        timeout=30,
    )
    assert ok.status_code == 200  # the server goes on serving
