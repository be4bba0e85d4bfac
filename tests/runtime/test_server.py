"""The OpenAI-compatible server: the real uvicorn server over a real tiny engine, driven by the
official ``openai`` client and raw ``httpx``; plus ``AsyncLLMEngine`` over a scripted engine.

Random weights make arbitrary text, so the tests check structure, token counts, and that streamed
deltas add up to the greedy non-streamed text.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from llmc.errors import StepFailedError
from llmc.runtime.outputs import CompletionOutput, RequestOutput
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.server import AsyncLLMEngine, EngineDeadError, QueueFullError, build_app
from llmc.runtime.stats import EngineStats

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

MODEL = "tiny-llama"
MAX_MODEL_LEN = 128
GREEDY = {"temperature": 0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def served(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    """The real server over a real tiny engine: built for cpu, run by ONNX Runtime."""
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    with running_server(engine, MODEL, max_waiting=8) as server:
        yield server
    assert not server.engine.is_running


@pytest.fixture
def client(served: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def http(served: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=60) as c:
        yield c


def _wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def test_models_and_health(http: httpx.Client) -> None:
    models = http.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in models["data"]] == [
        (MODEL, "model", MAX_MODEL_LEN)
    ]
    assert http.get("/health").status_code == 200


def test_chat_completion_and_stream(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "To be, or not to be"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion"
    assert whole.model == MODEL and len(whole.choices) == 1
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 8
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 8

    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert chunks[0].choices[0].delta.role == "assistant"
    *content, last, usage = chunks
    assert last.choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content)
    text = "".join(c.choices[0].delta.content or "" for c in [*content, last])
    assert text == choice.message.content
    assert usage.choices == [] and usage.usage == whole.usage


def test_completion_and_stream_with_usage(client: openai.OpenAI, tiny_llama_dir: Path) -> None:
    prompt = "ROMEO: But soft, what light"
    whole = client.completions.create(model=MODEL, prompt=prompt, **GREEDY)
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion"
    assert whole.choices[0].finish_reason == "length" and whole.choices[0].index == 0
    assert whole.usage is not None and whole.usage.completion_tokens == 8

    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    *deltas, usage = chunks
    assert {c.object for c in chunks} == {"text_completion"}
    assert "".join(c.choices[0].text for c in deltas) == whole.choices[0].text
    assert deltas[-1].choices[0].finish_reason == "length"
    assert usage.choices == [] and usage.usage == whole.usage

    # The same prompt as token ids gives the same greedy completion.
    from transformers import AutoTokenizer

    prompt_ids = AutoTokenizer.from_pretrained(tiny_llama_dir).encode(prompt)
    assert len(prompt_ids) == whole.usage.prompt_tokens
    by_ids = client.completions.create(model=MODEL, prompt=prompt_ids, **GREEDY)
    assert by_ids.choices[0].text == whole.choices[0].text


def _error(response: httpx.Response, status: int, param: str | None = None) -> str:
    """Check OpenAI's error body; returns the message."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    return error["message"]


def test_bad_requests_get_openai_errors(http: httpx.Client) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    bad_json = http.post(
        "/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"}
    )
    assert "JSON" in _error(bad_json, 400)
    assert "temperature" in _error(
        http.post("/v1/chat/completions", json=chat | {"temperature": "hot"}), 400, "temperature"
    )
    assert "messages" in _error(
        http.post("/v1/chat/completions", json={"model": MODEL}), 400, "messages"
    )
    assert _error(http.post("/v1/completions", json={"model": MODEL, "prompt": 7}), 400, "prompt")
    assert _error(http.post("/v1/chat/completions", json=[chat]), 400)
    missing = http.post("/v1/chat/completions", json=chat | {"model": "gpt-4"})
    assert "gpt-4" in _error(missing, 404, "model")
    assert missing.json()["error"]["code"] == "model_not_found"
    assert _error(http.post("/v1/chat/completions", json=chat | {"n": 1000}), 400, "n")
    assert _error(http.post("/v1/completions", json={"model": MODEL, "prompt": ""}), 400, "prompt")
    out_of_vocab = http.post("/v1/completions", json={"model": MODEL, "prompt": [5, 99999]})
    assert "99999" in _error(out_of_vocab, 400, "prompt")
    assert _error(http.get("/v1/nowhere"), 404)

    long_prompt = {"model": MODEL, "prompt": "word " * 400, "max_tokens": 4}
    too_long = http.post("/v1/completions", json=long_prompt)
    assert str(MAX_MODEL_LEN) in _error(too_long, 400, "prompt")
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    too_many = http.post("/v1/chat/completions", json=chat | {"max_completion_tokens": 1000})
    assert str(MAX_MODEL_LEN) in _error(too_many, 400, "messages")

    ok = http.post("/v1/chat/completions", json=chat)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2
    assert http.get("/health").status_code == 200


def test_openai_client_gets_typed_errors(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4", messages=messages)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as many:
        client.chat.completions.create(model=MODEL, messages=messages, n=17)
    assert many.value.param == "n" and "limit of 16" in many.value.message
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt="x", max_tokens=MAX_MODEL_LEN)
    assert too_long.value.code == "context_length_exceeded"
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in too_long.value.message


def test_client_disconnect_aborts_the_request(served: LiveServer, http: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "Now is the winter", "max_tokens": 64, "ignore_eos": True}
    # Streamed: the client reads one chunk and hangs up.
    with http.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
        request_id = json.loads(next(response.iter_lines()).removeprefix("data: "))["id"]
        served.steps.clear()  # hold the engine so the request cannot finish first
    _wait_until(lambda: served.engine.num_running == 0, "the stream is dropped")
    served.steps.set()
    _wait_until(lambda: request_id in served.aborted, "the streamed request is aborted")

    # Not streamed: the client gives up while the engine is held.
    served.steps.clear()
    num_aborted = len(served.aborted)
    with pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json=body, timeout=0.5)
    _wait_until(lambda: served.engine.num_waiting == 0, "the request is dropped")
    served.steps.set()
    _wait_until(lambda: len(served.aborted) == num_aborted + 1, "the request is aborted")
    assert served.aborted[-1].startswith("cmpl-") and served.engine.num_running == 0


def test_stop_string_cuts_the_text(client: openai.OpenAI) -> None:
    args = {"model": MODEL, "prompt": "KING HENRY:", "temperature": 0, "max_tokens": 24}
    text = client.completions.create(**args, extra_body={"ignore_eos": True}).choices[0].text
    start = next(i for i in range(2, len(text) - 1) if text[i : i + 2].isalpha())
    stop = text[start : start + 2]
    expected = text[: text.index(stop)]
    body = args | {"stop": [stop], "extra_body": {"ignore_eos": True}}
    cut = client.completions.create(**body).choices[0]
    assert (cut.text, cut.finish_reason) == (expected, "stop")
    deltas = list(client.completions.create(**body, stream=True))
    assert "".join(c.choices[0].text for c in deltas) == expected


def test_metrics(http: httpx.Client) -> None:
    http.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 2})
    text = http.get("/metrics").text
    assert "vllm:request_success_total{" in text and "vllm:num_requests_running{" in text
    assert "vllm:time_to_first_token_seconds_count{" in text


def test_api_key(served: LiveServer) -> None:
    app = build_app(served.engine, MODEL, api_key="sesame")

    async def run() -> tuple[int, int, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            no_key = await c.get("/v1/models")
            key = await c.get("/v1/models", headers={"Authorization": "Bearer sesame"})
            health = await c.get("/health")
            return no_key.status_code, key.status_code, health.status_code

    assert asyncio.run(run()) == (401, 200, 200)


# AsyncLLMEngine over a scripted engine: one token per request per step, "x" per token.


class ScriptedEngine:
    """Implements the LLMEngine surface AsyncLLMEngine uses; steps make no progress while
    ``gate`` is clear."""

    tokenizer = None
    max_model_len = 32
    vocab_size = 1000
    grammars = None  # no constraint is sent to it

    def __init__(self) -> None:
        self.requests: dict[str, tuple[list[int], int]] = {}
        self.aborted: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt=None,
        grammar=None,
        lora_request=None,
    ) -> None:
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"longer than max_model_len {self.max_model_len}")
        self.requests[request_id] = ([], params.max_tokens)

    def abort_request(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.requests.pop(request_id, None)

    def list_loras(self) -> list:
        return []  # no LoRA slots

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def stats(self) -> EngineStats:
        n = len(self.requests)
        return EngineStats(n, 0, n / 10, 0, 0, 0, 10 - n, 10)

    def step(self) -> list[RequestOutput]:
        time.sleep(0.001)
        if not self.gate.is_set():
            return []
        outputs = []
        for request_id, (tokens, max_tokens) in list(self.requests.items()):
            tokens.append(7)
            done = len(tokens) == max_tokens
            finish = "length" if done else None
            completion = CompletionOutput(0, "x" * len(tokens), list(tokens), finish)
            outputs.append(RequestOutput(request_id, None, [1], [completion], done))
            if done:
                del self.requests[request_id]
        return outputs


def _collect(engine: AsyncLLMEngine, request_id: str, max_tokens: int) -> list[RequestOutput]:
    async def run() -> list[RequestOutput]:
        params = SamplingParams(max_tokens=max_tokens)
        return [out async for out in engine.generate([1, 2], params, request_id)]

    return asyncio.run(run())


def test_async_engine_streams_until_finished() -> None:
    engine = AsyncLLMEngine(ScriptedEngine())  # type: ignore[arg-type]
    outputs = _collect(engine, "a", 5)
    assert outputs[-1].finished and outputs[-1].outputs[0].text == "xxxxx"
    assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
    with pytest.raises(ValueError, match="max_model_len of 32"):  # refused before it queues
        _collect(engine, "b", 40)
    assert engine.num_waiting == 0 and engine.num_running == 0
    engine.shutdown()
    assert not engine.is_running
    with pytest.raises(EngineDeadError):
        _collect(engine, "c", 1)


def test_async_engine_aborts_when_the_consumer_stops() -> None:
    scripted = ScriptedEngine()
    engine = AsyncLLMEngine(scripted)  # type: ignore[arg-type]

    async def run() -> None:
        params = SamplingParams(max_tokens=20)
        async for _ in engine.generate([1], params, "a"):
            break

    asyncio.run(run())
    deadline = time.monotonic() + 5
    while scripted.aborted != ["a"]:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert engine.num_running == 0 and not scripted.requests
    engine.shutdown()


def test_async_engine_fails_the_step_then_dies_after_consecutive_failed_steps() -> None:
    """A step that raises something other than StepFailedError names no requests: all of
    them fail (and are aborted); the engine dies only at the second failed step in a row."""
    scripted = ScriptedEngine()
    scripted.step = lambda: 1 / 0  # type: ignore[method-assign]
    engine = AsyncLLMEngine(scripted, max_consecutive_step_failures=2)  # type: ignore[arg-type]
    with pytest.raises(StepFailedError, match="ZeroDivisionError"):
        _collect(engine, "a", 3)
    assert engine.is_running and scripted.aborted == ["a"] and not scripted.requests
    with pytest.raises(StepFailedError, match="ZeroDivisionError"):
        _collect(engine, "b", 3)
    _wait_until(lambda: not engine.is_running, "the engine stops")
    with pytest.raises(EngineDeadError, match="2 failed steps in a row"):
        _collect(engine, "c", 3)
    assert engine.num_finished == {"stop": 0, "length": 0, "abort": 0, "error": 2}


def test_async_engine_bounds_the_waiting_queue_and_fails_pending_on_shutdown() -> None:
    scripted = ScriptedEngine()
    scripted.gate.clear()  # no step completes: every request keeps waiting
    engine = AsyncLLMEngine(scripted, max_waiting=2)  # type: ignore[arg-type]

    async def run() -> list[BaseException]:
        params = SamplingParams(max_tokens=3)
        waiting = [asyncio.ensure_future(anext(engine.generate([1], params, r))) for r in "ab"]
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFullError):
            await anext(engine.generate([1], params, "c"))
        assert engine.num_waiting == 2
        engine.shutdown()
        return await asyncio.gather(*waiting, return_exceptions=True)

    errors = asyncio.run(run())
    assert all(isinstance(e, EngineDeadError) for e in errors)


def test_full_queue_gets_503_with_retry_after_and_dead_engine_fails_health() -> None:
    scripted = ScriptedEngine()
    engine = AsyncLLMEngine(scripted, max_waiting=0)  # type: ignore[arg-type]
    app = build_app(engine, MODEL, retry_after_s=3)
    body = {"model": MODEL, "prompt": [1, 2], "max_tokens": 2}

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return await c.post("/v1/completions", json=body)

    async def health() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return (await c.get("/health")).status_code

    full = asyncio.run(post())
    assert full.status_code == 503 and full.headers["retry-after"] == "3"
    assert full.json()["error"]["code"] == "server_overloaded"
    body["prompt"] = [1, 5000]  # outside the vocabulary: a 400 even when the queue is full
    bad = asyncio.run(post())
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    body["prompt"] = [1, 2]
    assert asyncio.run(health()) == 200
    engine.shutdown()
    assert asyncio.run(health()) == 503
    dead = asyncio.run(post())
    assert dead.status_code == 503 and dead.json()["error"]["type"] == "server_error"
