"""Hostile structured-output constraints against the real server on 127.0.0.1: none can stop the
engine, fail another request, or reach a client as a 500 or a library's internals.

Each constraint here was accepted by llguidance's compiler and failed at the first token, or
compiled on the engine thread, or stopped the engine after three requests; the server now
refuses it with a 400 naming the field and the limit, or ends only that request.
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

from llmc.runtime.errors import InvalidRequestError
from llmc.runtime.server.errors import QueueFullError
from llmc.runtime.server.limits import RequestLimits
from llmc.runtime.structured.grammar import library_message
from llmc.runtime.structured.structured_outputs import StructuredOutputsParams

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

MODEL = "tiny-llama"
FAILURES_TO_DIE = 3  # the server's max_consecutive_step_failures
# A required property that is the object itself: every output is infinitely deep.
SELF_REQUIRED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
# Ten free choices, then an endless forced run: passes the compile-time probe (four tokens) and
# fails in llguidance at about the tenth token, whichever letters the model picks.
LATE_FAILURE = 'start: c c c c c c c c c c tail\nc: "x" | "z"\ntail: "a" tail\n'


@pytest.fixture(scope="module")
def served(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=48)
    limits = RequestLimits(max_choices=60_000)
    with running_server(
        engine, MODEL, max_consecutive_step_failures=FAILURES_TO_DIE, limits=limits
    ) as server:
        yield server


def _complete(server: LiveServer, constraint: dict, **extra) -> httpx.Response:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 24, "temperature": 0}
    return httpx.post(server.url + "/v1/completions", json=body | constraint | extra, timeout=120)


def _assert_serving(server: LiveServer) -> None:
    """The engine is alive: /health 200, a plain completion 200, every KV block free."""
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    ok = _complete(server, {})
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["finish_reason"] in ("stop", "length")
    stats = server.engine.stats
    assert stats.num_free_blocks == stats.num_total_blocks


def _error(response: httpx.Response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    message = error["message"]
    assert "<state>" not in message and "panicked" not in message and "\n" not in message
    return message


def test_requests_that_fail_their_own_constraint_never_stop_the_engine(served):
    """More such requests than the dead-man count, in a row: each its own 400, then the
    engine serves on."""
    for _ in range(FAILURES_TO_DIE + 1):
        message = _error(_complete(served, {"structured_outputs": {"json": SELF_REQUIRED}}),
                         "structured_outputs")  # fmt: skip
        assert "limit 50000" in message
    _assert_serving(served)


@pytest.mark.parametrize(
    ("constraint", "param", "reason"),
    [
        ({"structured_outputs": {"regex": "a{1000000}"}}, "structured_outputs", "max_regex_repeat"),
        ({"structured_outputs": {"grammar": 'start: "a"~5..20000'}}, "structured_outputs",
         "max_regex_repeat"),
        ({"structured_outputs": {"choice": [f"c{i}" for i in range(60_001)]}},
         "structured_outputs", "max_choices"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
            "type": "object", "description": "x" * 1_100_000}}}}, "response_format",
         "max_constraint_bytes"),
        # no finite output: an endless forced run, a $ref cycle with nothing at the bottom
        ({"structured_outputs": {"grammar": 'root ::= "a" root'}}, "structured_outputs",
         "Too many items"),
        ({"structured_outputs": {"json": {"$ref": "#/$defs/A", "$defs": {"A": {
            "$ref": "#/$defs/A"}}}}}, "structured_outputs", "no output satisfies it"),
    ],
)  # fmt: skip
def test_a_constraint_past_a_limit_is_a_400_naming_the_limit(served, constraint, param, reason):
    assert reason in _error(_complete(served, constraint), param)


def test_a_regex_repetition_within_the_bound_compiles(served):
    response = _complete(served, {"structured_outputs": {"regex": "[a-z]{3000}"}}, max_tokens=8)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert set(choice["text"]) <= set("abcdefghijklmnopqrstuvwxyz")


def test_a_choice_of_2500_strings_is_served(served):
    choices = [f"item-{i:04d}" for i in range(2500)]
    response = _complete(served, {"structured_outputs": {"choice": choices}})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] in choices


def test_a_grammar_that_may_go_on_stops_at_max_tokens_or_completes(served):
    """``root ::= "a" root | "b"``: every output is a's and one b; the model may keep writing
    a's until max_tokens ("length")."""
    response = _complete(
        served, {"structured_outputs": {"grammar": 'root ::= "a" root | "b"'}}, max_tokens=6
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    text = choice["text"]
    if choice["finish_reason"] == "stop":
        assert text.endswith("b") and set(text[:-1]) <= {"a"}
    else:
        assert choice["finish_reason"] == "length" and set(text) <= {"a"}


def test_a_constraint_failing_mid_generation_ends_that_request_alone(served):
    """The late failure, whole and streamed, more times than the dead-man count, each beside a
    plain request: the failing one gets its own error (a 400; in-band in the stream), the other
    its text, and the engine serves on."""

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as client:
            body = {"model": MODEL, "prompt": "Hello", "max_tokens": 40, "temperature": 0}
            bad = body | {"structured_outputs": {"grammar": LATE_FAILURE}}
            calls = []
            for i in range(FAILURES_TO_DIE + 1):
                calls.append(client.post("/v1/completions", json=bad | {"stream": i % 2 == 1}))
                calls.append(client.post("/v1/completions", json=body))
            return await asyncio.gather(*calls)

    responses = asyncio.run(run())
    for i, response in enumerate(responses[0::2]):
        if i % 2 == 0:
            message = _error(response, "structured_outputs")
        else:
            assert response.status_code == 200  # the headers went out with the first token
            events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            error = json.loads(events[-2])["error"]
            assert error["type"] == "invalid_request_error"
            message = error["message"]
        assert "constraint failed after" in message and "Too many items" in message
        assert "<state>" not in message
    for response in responses[1::2]:
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    _assert_serving(served)


def test_a_large_choice_compiles_off_the_engine_thread(served):
    """While 50,000 choices compile (a fraction of a second to seconds), a plain request sent
    after it is answered first: the engine thread is not the one compiling."""
    choices = [f"option-{i:05d}-{i * 7919 % 100_003:06d}" for i in range(50_000)]
    order: list[str] = []

    def send(name: str, constraint: dict) -> None:
        response = _complete(served, constraint, max_tokens=4)
        assert response.status_code == 200, response.text
        order.append(name)

    big = threading.Thread(
        target=send, args=("choice", {"structured_outputs": {"choice": choices}})
    )
    big.start()
    small = threading.Thread(target=send, args=("plain", {}))
    started = threading.Event()
    threading.Timer(0.05, lambda: (small.start(), started.set())).start()
    big.join()
    started.wait()
    small.join()
    assert order == ["plain", "choice"]


def test_the_compile_deadline_refuses_slow_constraints_and_a_busy_pool(tiny_tokenizer):
    """A 50,000-string choice takes longer than a 20 ms deadline: its request gets the 400;
    the next one finds the only worker still busy with it: a 503 (QueueFullError)."""
    from llmc.runtime.server.grammar_pool import GrammarPool
    from llmc.runtime.structured.grammar_compiler import GrammarCompiler

    vocab_size = len(tiny_tokenizer)
    compiler = GrammarCompiler(tiny_tokenizer, vocab_size, [tiny_tokenizer.eos_token_id])
    pool = GrammarPool(compiler, num_workers=1, timeout_s=0.02)
    slow = StructuredOutputsParams(choice=tuple(f"w{i}-{i * 31:07d}" for i in range(50_000)))

    async def run() -> tuple[BaseException, BaseException]:
        first = asyncio.ensure_future(pool.compile(slow))
        await asyncio.sleep(0.05)  # the worker has taken it
        second = asyncio.ensure_future(pool.compile(StructuredOutputsParams(regex="a|b")))
        results = await asyncio.gather(first, second, return_exceptions=True)
        return results[0], results[1]

    try:
        first, second = asyncio.run(run())
    finally:
        pool.shutdown()
    assert isinstance(first, InvalidRequestError) and "took longer than" in str(first)
    assert isinstance(second, QueueFullError)


def test_library_messages_lose_their_state_dump_and_backtrace():
    dump = 'parser error: Too many items (limit 50000)\n<state>\nTokens: ⟦a⟧\nParser: {"rows": 2}'
    assert library_message(dump) == "parser error: Too many items (limit 50000)"
    panic = "thread '<unnamed>' panicked at src/x.rs:1:2:\n" + "frame\n" * 50
    assert "panicked" not in library_message(panic) and "frame" not in library_message(panic)
    assert len(library_message("x" * 10_000)) == 300
