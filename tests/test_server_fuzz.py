"""Fuzzing the real uvicorn server over a real tiny engine (issue 17: no request can stop the
server).

Two generators, both bounded for CI:

- schemathesis, from the server's own ``/openapi.json`` (its request bodies are the pydantic
  models of ``protocol.py``): the coverage phase (every field at and past its bounds) and the
  fuzzing phase, positive and negative data, on every operation. The schema is narrowed to the
  one model name the server serves, or nearly every request would stop at the 404.
- hypothesis strategies over the request models' fields (`engine_requests`), for requests that
  reach the engine: extreme seeds, many stop strings, lone surrogates, ``n`` at and past the
  server's limit, logprobs, echo, streaming, unknown fields.

Every response must be a 2xx or a 4xx in OpenAI's error body (`response_problem`): no 5xx, no
in-band error event in a stream, no hang (a client timeout far above the slowest legitimate
request); data outside the schema must be refused. Afterwards the server still serves a normal
completion, ``/health`` is 200 and every KV block is back in the pool.
``benchmarks/fuzz_server.py`` runs the same generators for longer and counts instead of
stopping at the first failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from schemathesis.checks import negative_data_rejection, not_a_server_error

from llmc.runtime.sampling_params import MAX_LOGPROBS
from llmc.runtime.server.chat_messages import ChatMessage
from llmc.runtime.server.limits import RequestLimits
from llmc.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.test_server import MODEL, _wait_until

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
JSON = {"content-type": "application/json"}
MAX_N = RequestLimits().max_n  # n past it gets a 400
SCHEMA_CHECKS = [not_a_server_error, negative_data_rejection]
DROPPED_AFTER = "the connection was dropped after a"


def response_problem(status: int, content_type: str, text: str) -> str | None:
    """What is wrong with a response, or None: a 5xx; a 4xx without OpenAI's error body; a
    stream with an in-band error event or without its closing ``[DONE]``."""
    if status >= 500:
        return f"{status}: {text[:500]}"
    if status >= 400:
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            error = None
        if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
            return f"{status} without OpenAI's error body: {text[:500]}"
    elif content_type.startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in text.splitlines() if line]
        if not events or events[-1] != "[DONE]":
            return f"stream cut short: ...{text[-500:]}"
        for event in events[:-1]:
            if "error" in json.loads(event):
                return f"in-band error event: {event[:500]}"
    return None


def openapi_schema(base_url: str, model: str, api_key: str | None) -> schemathesis.BaseSchema:
    """The server's own ``/openapi.json`` as a schemathesis schema, ``model`` narrowed to the
    one model the server serves; requests go to ``base_url`` with the API key."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    raw = httpx.get(base_url + "/openapi.json", headers=headers, timeout=30).json()
    for name in (CompletionRequest.__name__, ChatCompletionRequest.__name__):
        raw["components"]["schemas"][name]["properties"]["model"] = {"enum": [model]}
    schema = schemathesis.openapi.from_dict(raw)
    schema.config.update(base_url=base_url, headers=headers, request_timeout=HANG_S)
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
_PROMPT = st.one_of(
    _TEXT.filter(bool), st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=1, max_size=40)
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


def post_and_check(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[str, str | None]:
    """POST ``body`` (``ensure_ascii`` JSON: lone surrogates travel as escapes); returns the
    status (or ``hang``, ``dropped``) and what went wrong, or None: see `response_problem`; no
    answer in ``client``'s timeout; the connection dropped, during the request or right after
    it (a ``GET /health`` on the same keep-alive connection must answer)."""
    try:
        response = client.post(path, content=json.dumps(body).encode(), headers=JSON)
    except httpx.TimeoutException:
        return "hang", "no answer: the server hangs"
    except httpx.TransportError as exc:
        return "dropped", f"connection dropped without a response: {exc!r}"
    status = str(response.status_code)
    content_type = response.headers.get("content-type", "")
    problem = response_problem(response.status_code, content_type, response.text)
    try:
        client.get("/health")
    except httpx.TransportError as exc:
        dropped = f"{DROPPED_AFTER} {status} response: {exc!r}"
        problem = f"{problem}\n{dropped}" if problem else dropped
    return status, problem


# --- the tests -------------------------------------------------------------------------------


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
def openapi(fuzzed: LiveServer) -> schemathesis.BaseSchema:
    schema = openapi_schema(fuzzed.url, MODEL, KEY)
    schema.config.generation.update(
        modes=list(schemathesis.GenerationMode), max_examples=100, deterministic=True
    )
    schema.config.phases.update(phases=["examples", "coverage", "fuzzing"])
    return schema


@pytest.fixture(scope="module")
def http(fuzzed: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzzed.url, timeout=HANG_S, headers=AUTH) as client:
        yield client


schema = schemathesis.pytest.from_fixture("openapi")


@schema.parametrize()
@settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_schema_fuzzing_gets_no_5xx_and_no_hang(case: schemathesis.Case) -> None:
    try:
        response = case.call_and_validate(checks=SCHEMA_CHECKS, timeout=HANG_S)
    except requests.Timeout as exc:
        raise AssertionError(f"no answer in {HANG_S} s: {case.as_curl_command()}") from exc
    content_type = response.headers.get("content-type", [""])[0]  # schemathesis: name -> list
    problem = response_problem(response.status_code, content_type, response.text)
    assert problem is None, f"{problem}\n{case.as_curl_command()}"


def test_engine_fuzzing_gets_no_5xx_and_no_hang(http: httpx.Client) -> None:
    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(engine_requests())
    def check(request: tuple[str, dict[str, Any]]) -> None:
        path, body = request
        _, problem = post_and_check(http, path, body)
        assert problem is None, f"{problem}\nPOST {path} {json.dumps(body)}"

    check()


def test_after_fuzzing_the_server_serves_and_every_block_is_free(
    fuzzed: LiveServer, http: httpx.Client
) -> None:
    """Runs after the fuzzing above (pytest keeps the file's order)."""
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 4, "ignore_eos": True}
    ok = http.post("/v1/completions", json=body)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4, ok.text
    assert http.get("/health").status_code == 200
    engine = fuzzed.engine

    def pool_is_free() -> bool:
        stats = engine.stats
        return stats.num_free_blocks == stats.num_total_blocks and stats.num_running == 0

    _wait_until(pool_is_free, "every block is back in the pool")
    text = http.get("/metrics").text
    metrics = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0
    assert metrics["vllm:num_requests_running"] == metrics["vllm:num_requests_waiting"] == 0
