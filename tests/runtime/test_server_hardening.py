"""Server hardening against the real uvicorn server over a real tiny engine: hostile and
malformed requests (each a 4xx in OpenAI's error body, the server unharmed), API key on every
non-public route, CORS, body size cap, readiness, metrics under vLLM's names, and client
disconnects returning every KV block to the pool.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmc.runtime.server import AsyncLLMEngine, build_app
from llmc.runtime.server.limits import RequestLimits
from tests.runtime.test_server import MAX_MODEL_LEN, MODEL, _wait_until

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "https://allowed.example"
MAX_BODY = 64 * 1024
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def hardened(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    with running_server(
        engine,
        MODEL,
        max_waiting=8,
        api_key=KEY,
        allowed_origins=[ORIGIN],
        limits=RequestLimits(max_request_body_bytes=MAX_BODY),
    ) as server:
        yield server


@pytest.fixture
def http(hardened: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=hardened.url, timeout=60, headers=AUTH) as c:
        yield c


CMPL = {"model": MODEL, "prompt": "Hello there", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
C, H = "/v1/completions", "/v1/chat/completions"

# (name, path, JSON body or raw bytes, extra headers, status, param, code)
CASES: list[tuple[str, str, object, dict[str, str], int, str | None, str | None]] = [
    ("bad json", C, b'{"model": ', JSON, 400, None, None),
    ("json array body", C, [CMPL], {}, 400, None, None),
    ("not json", C, b"hello", {"content-type": "text/plain"}, 400, None, None),
    ("invalid utf-8", C, b'{"model": "tiny-llama", "prompt": "\xff\xfe"}', JSON, 400, None, None),
    (
        "nan temperature",
        C,
        b'{"model": "tiny-llama", "prompt": "a", "temperature": NaN}',
        JSON,
        400,
        "temperature",
        None,
    ),
    ("deeply nested json", C, b"[" * 30_000 + b"]" * 30_000, JSON, 400, None, None),
    ("invalid utf-8, no content type", C, b'{"model": "\xff"}', {}, 400, None, None),
    (
        "huge max_tokens",
        C,
        CMPL | {"max_tokens": 10**30},
        {},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    ("huge seed", C, CMPL | {"seed": 10**30}, {}, 400, "seed", None),
    ("missing model", C, {"prompt": "a"}, {}, 400, "model", None),
    ("unknown model", C, CMPL | {"model": "gpt-4"}, {}, 404, "model", "model_not_found"),
    ("missing prompt", C, {"model": MODEL}, {}, 400, "prompt", None),
    ("prompt of wrong type", C, CMPL | {"prompt": 7}, {}, 400, "prompt", None),
    ("empty prompt", C, CMPL | {"prompt": ""}, {}, 400, "prompt", None),
    ("negative token id", C, CMPL | {"prompt": [-1, 3]}, {}, 400, "prompt", None),
    ("token id outside vocab", C, CMPL | {"prompt": [5, 99999]}, {}, 400, "prompt", None),
    ("negative max_tokens", C, CMPL | {"max_tokens": -5}, {}, 400, "max_tokens", None),
    ("zero max_tokens", C, CMPL | {"max_tokens": 0}, {}, 400, "max_tokens", None),
    ("string max_tokens", C, CMPL | {"max_tokens": "10"}, {}, 400, "max_tokens", None),
    ("fractional max_tokens", C, CMPL | {"max_tokens": 1.5}, {}, 400, "max_tokens", None),
    ("huge n", C, CMPL | {"n": 10**6}, {}, 400, "n", None),
    ("zero n", H, CHAT | {"n": 0}, {}, 400, "n", None),
    ("string temperature", H, CHAT | {"temperature": "hot"}, {}, 400, "temperature", None),
    ("negative temperature", C, CMPL | {"temperature": -1}, {}, 400, "temperature", None),
    ("top_p zero", C, CMPL | {"top_p": 0}, {}, 400, "top_p", None),
    ("min_p above one", C, CMPL | {"min_p": 1.5}, {}, 400, "min_p", None),
    ("presence_penalty 3", C, CMPL | {"presence_penalty": 3}, {}, 400, "presence_penalty", None),
    (
        "repetition_penalty 0",
        C,
        CMPL | {"repetition_penalty": 0},
        {},
        400,
        "repetition_penalty",
        None,
    ),
    ("min_tokens > max_tokens", C, CMPL | {"min_tokens": 10}, {}, 400, "min_tokens", None),
    (
        "over-long prompt",
        C,
        CMPL | {"prompt": "word " * 400},
        {},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    (
        "max_tokens past context",
        H,
        CHAT | {"max_completion_tokens": 1000},
        {},
        400,
        "messages",
        "context_length_exceeded",
    ),
    (
        "bad role",
        H,
        CHAT | {"messages": [{"role": "wizard", "content": "x"}]},
        {},
        400,
        "messages",
        None,
    ),
    ("empty messages", H, CHAT | {"messages": []}, {}, 400, "messages", None),
    ("messages not a list", H, CHAT | {"messages": "hi"}, {}, 400, "messages", None),
    (
        "content of wrong type",
        H,
        CHAT | {"messages": [{"role": "user", "content": 5}]},
        {},
        400,
        "messages",
        None,
    ),
    ("chat logprobs not bool", H, CHAT | {"logprobs": "yes"}, {}, 400, "logprobs", None),
    ("top_logprobs without logprobs", H, CHAT | {"top_logprobs": 2}, {}, 400, "top_logprobs", None),
    (
        "top_logprobs 21",
        H,
        CHAT | {"logprobs": True, "top_logprobs": 21},
        {},
        400,
        "top_logprobs",
        None,
    ),
    ("completion logprobs 50", C, CMPL | {"logprobs": 50}, {}, 400, "logprobs", None),
    ("completion logprobs true", C, CMPL | {"logprobs": True}, {}, 400, "logprobs", None),
    ("stop of wrong type", C, CMPL | {"stop": 5}, {}, 400, "stop", None),
    ("stop list with a number", C, CMPL | {"stop": ["a", 1]}, {}, 400, "stop", None),
    ("negative stop token", C, CMPL | {"stop_token_ids": [-3]}, {}, 400, "stop_token_ids", None),
    ("logit_bias", C, CMPL | {"logit_bias": {"5": 10}}, {}, 400, "logit_bias", None),
    ("best_of above n", C, CMPL | {"best_of": 3}, {}, 400, "best_of", None),
    ("stream not bool", C, CMPL | {"stream": "yes"}, {}, 400, "stream", None),
    (
        "stream_options without stream",
        C,
        CMPL | {"stream_options": {"include_usage": True}},
        {},
        400,
        "stream_options",
        None,
    ),
    ("string seed", C, CMPL | {"seed": "abc"}, {}, 400, "seed", None),
    ("missing api key", C, CMPL, {"Authorization": ""}, 401, None, "invalid_api_key"),
    ("wrong api key", C, CMPL, {"Authorization": "Bearer open"}, 401, None, "invalid_api_key"),
    ("huge body", C, CMPL | {"prompt": "x" * (2 * MAX_BODY)}, {}, 413, None, "request_too_large"),
]


def _send(http: httpx.Client, path: str, body: object, headers: dict[str, str]) -> httpx.Response:
    if isinstance(body, bytes):
        return http.post(path, content=body, headers=headers)
    return http.post(path, json=body, headers=headers)


def _check_error(
    response: httpx.Response, status: int, param: str | None, code: str | None
) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code), error
    return error


@pytest.mark.parametrize(
    ("name", "path", "body", "headers", "status", "param", "code"),
    CASES,
    ids=[case[0] for case in CASES],
)
def test_hostile_request_gets_its_4xx_and_the_server_still_serves(
    http: httpx.Client,
    name: str,
    path: str,
    body: object,
    headers: dict[str, str],
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    error = _check_error(_send(http, path, body, headers), status, param, code)
    if code == "context_length_exceeded":
        assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"]
    ok = http.post(C, json=CMPL)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2


def test_chunked_body_over_the_cap_gets_413(http: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap counts received bytes
        yield b'{"model": "tiny-llama", "prompt": "'
        for _ in range(2 * MAX_BODY // 1024):
            yield b"x" * 1024
        yield b'"}'

    response = http.post(C, content=chunks(), headers=JSON)
    _check_error(response, 413, None, "request_too_large")
    assert str(MAX_BODY) in response.json()["error"]["message"]


def test_api_key_guards_every_route_but_health_ready_metrics(hardened: LiveServer) -> None:
    with httpx.Client(base_url=hardened.url, timeout=30) as anonymous:
        for path in ("/health", "/ready", "/metrics"):
            assert anonymous.get(path).status_code == 200, path
        for path in ("/v1/models", "/docs", "/openapi.json", "/v1/nowhere"):
            assert anonymous.get(path).status_code == 401, path
        models = anonymous.get("/v1/models", headers=AUTH)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL
        assert anonymous.get("/v1/nowhere", headers=AUTH).status_code == 404
        assert anonymous.get(C, headers=AUTH).status_code == 405


def test_cors_only_for_allowed_origins(hardened: LiveServer) -> None:
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    with httpx.Client(base_url=hardened.url, timeout=30) as c:
        ok = c.options(C, headers={"Origin": ORIGIN} | preflight)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
        other = c.options(C, headers={"Origin": "https://evil.example"} | preflight)
        assert "access-control-allow-origin" not in other.headers
        get = c.get("/v1/models", headers={"Origin": ORIGIN} | AUTH)
        assert get.headers["access-control-allow-origin"] == ORIGIN

    # Without allowed origins (the default) no response carries CORS headers.
    app = build_app(hardened.engine, MODEL)

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return [
                await c.options(C, headers={"Origin": ORIGIN} | preflight),
                await c.get("/v1/models", headers={"Origin": ORIGIN}),
            ]

    for response in asyncio.run(run()):
        assert not any(h.startswith("access-control-") for h in response.headers)


def test_readiness_and_drain_gate(hardened: LiveServer, http: httpx.Client) -> None:
    drain = hardened.app.state.drain
    assert http.get("/ready").status_code == 200
    drain.draining = True
    try:
        assert http.get("/ready").status_code == 503
        assert http.get("/health").status_code == 200  # alive, just not taking traffic
        refused = http.post(C, json=CMPL)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "server_shutting_down"
    finally:
        drain.draining = False
    assert http.get("/ready").status_code == 200 and http.post(C, json=CMPL).status_code == 200


def _metrics(http: httpx.Client) -> dict[str, float]:
    """Sample name -> value (label model_name only, or the finished_reason for successes)."""
    values = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name.endswith("_created") or "le" in sample.labels:
                continue
            reason = sample.labels.get("finished_reason")
            values[sample.name + (f"[{reason}]" if reason else "")] = sample.value
    return values


def test_metrics_have_vllm_names_and_exact_counts(http: httpx.Client) -> None:
    before = _metrics(http)
    prompt = list(range(10, 50))  # 40 tokens: two full blocks of 16
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
    first = http.post(C, json=body).json()
    second = http.post(C, json=body).json()
    after = _metrics(http)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert first["usage"]["completion_tokens"] == second["usage"]["completion_tokens"] == 8
    assert delta["vllm:prompt_tokens_total"] == 80
    assert delta["vllm:generation_tokens_total"] == 16
    assert delta["vllm:request_success_total[length]"] == 2
    assert delta["vllm:time_to_first_token_seconds_count"] == 2
    assert delta["vllm:inter_token_latency_seconds_count"] == 14  # 7 gaps per request
    assert delta["vllm:e2e_request_latency_seconds_count"] == 2
    assert delta["vllm:prefix_cache_queries_total"] == 80
    assert delta["vllm:prefix_cache_hits_total"] == 32  # the second request reuses 2 blocks
    assert delta["vllm:num_preemptions_total"] == 0
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0.0


def _pool_is_free(engine: AsyncLLMEngine) -> bool:
    stats = engine.stats
    return stats.num_free_blocks == stats.num_total_blocks and stats.num_running == 0


def test_disconnect_mid_stream_returns_every_block(
    hardened: LiveServer, http: httpx.Client
) -> None:
    engine = hardened.engine
    body = {"model": MODEL, "prompt": "Now is the winter " * 4, "max_tokens": 80}
    with http.stream(
        "POST", C, json=body | {"stream": True, "ignore_eos": True, "n": 2}
    ) as response:
        lines = response.iter_lines()
        request_id = json.loads(next(lines).removeprefix("data: "))["id"]
        hardened.steps.clear()  # hold the engine: the request cannot finish on its own
        in_use = engine.stats
        assert in_use.num_free_blocks < in_use.num_total_blocks and in_use.kv_cache_usage > 0
    _wait_until(lambda: engine.num_in_flight == 0, "the server drops the stream")
    hardened.steps.set()
    _wait_until(lambda: request_id in hardened.aborted, "the request is aborted")
    _wait_until(lambda: _pool_is_free(engine), "every block is back in the pool")
    assert _metrics(http)["vllm:kv_cache_usage_perc"] == 0.0

    # Not streamed: the client gives up while the engine is held.
    hardened.steps.clear()
    num_aborted = len(hardened.aborted)
    with pytest.raises(httpx.ReadTimeout):
        http.post(C, json=body | {"ignore_eos": True}, timeout=0.5)
    _wait_until(lambda: engine.num_in_flight == 0, "the server drops the request")
    hardened.steps.set()
    _wait_until(lambda: len(hardened.aborted) > num_aborted, "the request is aborted")
    _wait_until(lambda: _pool_is_free(engine), "every block is back in the pool")
    assert hardened.aborted[-1].startswith("cmpl-") and hardened.aborted[-1] != request_id


def test_full_waiting_queue_gets_503_with_retry_after(
    hardened: LiveServer, http: httpx.Client
) -> None:
    """max_waiting=8: with the engine held, eight requests wait and the ninth is refused."""
    engine = hardened.engine
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 3, "ignore_eos": True}
    statuses: list[int] = []
    hardened.steps.clear()
    try:
        waiting = [
            threading.Thread(target=lambda: statuses.append(http.post(C, json=body).status_code))
            for _ in range(8)
        ]
        for t in waiting:
            t.start()
        _wait_until(lambda: engine.num_waiting == 8, "eight requests wait")
        refused = http.post(C, json=body)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "server_overloaded")
    finally:
        hardened.steps.set()
    for t in waiting:
        t.join(60)
    assert statuses == [200] * 8
    _wait_until(lambda: _pool_is_free(engine), "every block is back in the pool")
