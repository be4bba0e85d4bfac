"""Request validation of the real uvicorn server over a real tiny engine: invalid
Unicode anywhere is a 400 naming the field, every OpenAI field is honoured or refused by name,
and each per-request limit is a 400 naming it. The API key, HEAD and the event loop's liveness
are in ``test_server_access.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from llmc.errors import EngineConfigError
from llmc.runtime.server.limits import RequestLimits
from tests.runtime.test_server import MODEL

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"content-type": "application/json"}
VOCAB_SIZE = 512
C, H = "/v1/completions", "/v1/chat/completions"
CMPL = {"model": MODEL, "prompt": "Hello there", "max_tokens": 1}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
# The tiny models' template, plus the message's name: shows whether `name` reaches it.
NAMED_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{% if m.get('name') %}{{ m['name'] }}: {% endif %}"
    "{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def validated(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    engine.tokenizer.chat_template = NAMED_TEMPLATE
    with running_server(engine, MODEL, max_waiting=8, api_key=KEY) as server:
        yield server


@pytest.fixture
def http(validated: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=validated.url, timeout=120, headers=AUTH) as c:
        yield c


def _error(response: httpx.Response, status: int, param: str | None) -> str:
    """The error message, after checking the status, OpenAI's error body and the param."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error
    return error["message"]


def _still_serves(http: httpx.Client) -> None:
    ok = http.post(C, json=CMPL)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1, ok.text


# --- A. invalid Unicode ------------------------------------------------------------------------

SURROGATE = "a\ud800b"
UNICODE_CASES = [  # (name, path, body, the field the error names)
    ("prompt", C, CMPL | {"prompt": SURROGATE}, "prompt"),
    ("prompt list", C, CMPL | {"prompt": [SURROGATE]}, "prompt"),
    ("chat content", H, CHAT | {"messages": [{"role": "user", "content": SURROGATE}]}, "messages"),
    (
        "chat text part",
        H,
        CHAT | {"messages": [{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]},
        "messages",
    ),
    (
        "message name",
        H,
        CHAT | {"messages": [{"role": "user", "content": "Hi", "name": SURROGATE}]},
        "messages",
    ),
    ("model", C, CMPL | {"model": SURROGATE}, "model"),
    ("chat model", H, CHAT | {"model": "tiny\udfff"}, "model"),
    ("stop", C, CMPL | {"stop": SURROGATE}, "stop"),
    ("stop list", H, CHAT | {"stop": ["ok", SURROGATE]}, "stop"),
    ("user", C, CMPL | {"user": SURROGATE}, "user"),
    ("unknown field name", C, CMPL | {SURROGATE: 1}, None),
]


@pytest.mark.parametrize(
    ("name", "path", "body", "param"), UNICODE_CASES, ids=[c[0] for c in UNICODE_CASES]
)
def test_lone_surrogate_is_a_400_naming_the_field(
    http: httpx.Client, name: str, path: str, body: dict, param: str | None
) -> None:
    raw = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as a \ud800 escape
    message = _error(http.post(path, content=raw, headers=JSON), 400, param)
    assert "surrogate" in message and message.isascii()
    _still_serves(http)


# --- B. every field honoured or refused --------------------------------------------------------

MESSAGE = {"role": "user", "content": "Hi"}
NONE_ACCEPTED = object()  # a field no value of which is accepted (unknown to the endpoint)
REFUSED = [  # (path, field, a refused value, an accepted value)
    (H, "functions", [{"name": "f", "parameters": {}}], []),
    (H, "function_call", "auto", "none"),
    (H, "audio", {"voice": "alloy", "format": "wav"}, None),
    (H, "modalities", ["text", "audio"], ["text"]),
    (H, "prediction", {"type": "content", "content": "x"}, None),
    (H, "web_search_options", {}, None),
    (H, "reasoning_effort", "low", None),
    (H, "verbosity", "low", None),
    (H, "store", True, False),
    (H, "service_tier", "flex", "auto"),
    (C, "tools", [{"type": "function"}], NONE_ACCEPTED),  # chat only: unknown to completions
    (C, "top_logprobs", 2, NONE_ACCEPTED),
    (C, "foo", 1, NONE_ACCEPTED),
    (H, "foo", 1, NONE_ACCEPTED),
    (C, "use_beam_search", True, NONE_ACCEPTED),  # vLLM extras llmc does not honour
    (H, "chat_template_kwargs", {"enable_thinking": False}, NONE_ACCEPTED),
    (H, "stream_options", {"include_usage": True, "continuous_usage_stats": True}, None),
]


@pytest.mark.parametrize(
    ("path", "field", "refused", "accepted"),
    REFUSED,
    ids=[f"{'chat' if c[0] == H else 'completions'}-{c[1]}" for c in REFUSED],
)
def test_unsupported_field_is_a_400_naming_it(
    http: httpx.Client, path: str, field: str, refused: object, accepted: object
) -> None:
    body = CHAT if path == H else CMPL
    if field == "stream_options":
        body = body | {"stream": True}
    message = _error(http.post(path, json=body | {field: refused}), 400, field)
    assert field in message
    if accepted is NONE_ACCEPTED:
        assert message == f"Unrecognized request argument supplied: {field}"
    else:  # its neutral value is no reason to refuse a request
        ok = http.post(path, json=body | {field: accepted})
        assert ok.status_code == 200, ok.text


MESSAGE_CASES = [  # (name, message, what the error names)
    (
        "assistant tool_calls",
        {"role": "assistant", "content": None, "tool_calls": [{}]},
        "tool_calls",
    ),
    ("assistant function_call", {"role": "assistant", "function_call": {}}, "function_call"),
    ("function message", {"role": "function", "name": "f", "content": "42"}, "function"),
    (
        "image part",
        {"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
        "image_url",
    ),
    ("unknown key", MESSAGE | {"cache_control": {}}, "messages[1].cache_control"),
]


@pytest.mark.parametrize(
    ("name", "message", "named"), MESSAGE_CASES, ids=[c[0] for c in MESSAGE_CASES]
)
def test_unsupported_message_field_is_a_400_naming_it(
    http: httpx.Client, name: str, message: dict, named: str
) -> None:
    body = CHAT | {"messages": [MESSAGE, message]}
    assert named in _error(http.post(H, json=body), 400, "messages")


BOTH_CONSTRAINTS = {
    "response_format": {"type": "json_object"},
    "structured_outputs": {"regex": "a"},
}


@pytest.mark.parametrize(("path", "body"), [(C, CMPL), (H, CHAT)])
def test_two_constraint_fields_are_a_400_naming_the_one_to_drop(
    http: httpx.Client, path: str, body: dict
) -> None:
    response = http.post(path, json=body | BOTH_CONSTRAINTS)
    assert "not both" in _error(response, 400, "structured_outputs")


def test_message_name_reaches_the_chat_template(http: httpx.Client) -> None:
    def prompt_tokens(message: dict) -> int:
        response = http.post(H, json=CHAT | {"messages": [message]})
        assert response.status_code == 200, response.text
        return response.json()["usage"]["prompt_tokens"]

    assert prompt_tokens(MESSAGE | {"name": "Horatio"}) > prompt_tokens(MESSAGE)


def test_stop_token_ids_outside_the_vocabulary_are_a_400_stating_its_size(
    http: httpx.Client,
) -> None:
    for path, body in ((C, CMPL), (H, CHAT)):
        response = http.post(path, json=body | {"stop_token_ids": [5, VOCAB_SIZE]})
        message = _error(response, 400, "stop_token_ids")
        assert f"vocabulary size is {VOCAB_SIZE}" in message
        ok = http.post(path, json=body | {"stop_token_ids": [5, VOCAB_SIZE - 1]})
        assert ok.status_code == 200, ok.text


# --- C. limits ---------------------------------------------------------------------------------

LIMIT_CASES = [  # (field, bound, (path, body) at the limit, (path, body) one past it)
    ("n", "max_n", (C, CMPL | {"n": 16}), (C, CMPL | {"n": 17})),
    (
        "stop",
        "max_stop_strings",
        (C, CMPL | {"stop": ["x"] * 16}),
        (H, CHAT | {"stop": ["x"] * 17}),
    ),
    (
        "stop",
        "max_stop_string_chars",
        (C, CMPL | {"stop": "x" * 256}),
        (C, CMPL | {"stop": "x" * 257}),
    ),
    (
        "stop_token_ids",
        "max_stop_token_ids",
        (C, CMPL | {"stop_token_ids": list(range(64))}),
        (H, CHAT | {"stop_token_ids": list(range(65))}),
    ),
    ("logprobs", "max_logprobs", (C, CMPL | {"logprobs": 20}), (C, CMPL | {"logprobs": 21})),
    (
        "top_logprobs",
        "max_logprobs",
        (H, CHAT | {"logprobs": True, "top_logprobs": 20}),
        (H, CHAT | {"logprobs": True, "top_logprobs": 21}),
    ),
]


@pytest.mark.parametrize(
    ("field", "bound", "at", "past"), LIMIT_CASES, ids=[c[1] + "-" + c[0] for c in LIMIT_CASES]
)
def test_each_limit_is_a_400_naming_it(
    http: httpx.Client, field: str, bound: str, at: tuple, past: tuple
) -> None:
    limit = getattr(RequestLimits(), bound)
    message = _error(http.post(past[0], json=past[1]), 400, field)
    assert f"limit of {limit} ({bound}" in message and "--" + bound.replace("_", "-") in message
    ok = http.post(at[0], json=at[1])
    assert ok.status_code == 200, ok.text


def test_request_limits_refuse_settings_that_cannot_work() -> None:
    with pytest.raises(EngineConfigError, match="max_n must be an integer >= 1"):
        RequestLimits(max_n=0)
    with pytest.raises(EngineConfigError, match="max_logprobs must be at most 20"):
        RequestLimits(max_logprobs=21)
