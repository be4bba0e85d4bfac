"""No request can stop the server: fault injection into the real runner of a tiny engine served
by the real uvicorn server. A step that raises ends the requests in it with a 500 (or an SSE
error event once streaming) and frees their blocks; the other requests finish with the tokens
they get without the fault and /health stays 200; only failed steps in a row kill the engine.
Also the seed range, and the request counters for requests that end before their first token.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np
import pytest

from llmc.runtime.runners.step_inputs import StepInputs
from llmc.runtime.server import AsyncLLMEngine
from tests.runtime.test_server import MODEL, _wait_until
from tests.runtime.test_server_hardening import _metrics, _pool_is_free

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

C = "/v1/completions"
GREEDY = {"model": MODEL, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
PROMPTS = {"a": list(range(20, 30)), "b": list(range(40, 47)), "c": list(range(60, 72))}


class FaultyRunner:
    """The engine's real runner, with faults: the step numbered ``pause_before`` waits for
    ``resume`` (``paused`` is set meanwhile), steps numbered in ``fail_steps`` (or every step,
    with ``fail_all``) raise instead of running. Steps are numbered from 0 in call order."""

    def __init__(self, runner: object) -> None:
        self.runner = runner
        self.num_blocks = runner.num_blocks  # type: ignore[attr-defined]
        self.block_size = runner.block_size  # type: ignore[attr-defined]
        self.vocab_size = runner.vocab_size  # type: ignore[attr-defined]
        self.num_steps = 0
        self.fail_steps: set[int] = set()
        self.fail_all = False
        self.pause_before: int | None = None
        self.paused = threading.Event()
        self.resume = threading.Event()

    def execute(self, step: StepInputs) -> np.ndarray:
        n, self.num_steps = self.num_steps, self.num_steps + 1
        if n == self.pause_before:
            self.paused.set()
            self.resume.wait(30)
        if self.fail_all or n in self.fail_steps:
            raise RuntimeError(f"injected runner failure at step {n}")
        return self.runner.execute(step)  # type: ignore[attr-defined]

    def pause_at_next_step(self) -> int:
        """Pause the next step; returns its number."""
        self.paused.clear()
        self.resume.clear()
        self.pause_before = self.num_steps
        return self.num_steps


@dataclass
class Faulty:
    server: LiveServer
    engine: AsyncLLMEngine
    runner: FaultyRunner


@contextmanager
def _serve(
    running_server: ServerFactory, engine_dir: Path, max_consecutive_step_failures: int = 3
) -> Iterator[Faulty]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(engine_dir, num_blocks=32)
    runner = FaultyRunner(engine.runner)
    engine.runner = runner  # type: ignore[assignment]
    with running_server(
        engine, MODEL, max_waiting=8, max_consecutive_step_failures=max_consecutive_step_failures
    ) as server:
        try:
            yield Faulty(server, server.engine, runner)
        finally:
            runner.resume.set()


@pytest.fixture(scope="module")
def faulty(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[Faulty]:
    with _serve(running_server, tiny_llama_engine) as served:
        yield served


@pytest.fixture
def http(faulty: Faulty) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=faulty.server.url, timeout=60) as c:
        yield c


def _post_in_thread(http: httpx.Client, body: dict, into: dict[str, httpx.Response], key: str):
    thread = threading.Thread(target=lambda: into.__setitem__(key, http.post(C, json=body)))
    thread.start()
    return thread


def _texts(http: httpx.Client) -> dict[str, str]:
    """Each prompt's greedy completion with no fault."""
    texts = {}
    for key, prompt in PROMPTS.items():
        response = http.post(C, json=GREEDY | {"prompt": prompt})
        assert response.status_code == 200, response.text
        texts[key] = response.json()["choices"][0]["text"]
    return texts


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def _assert_500(response: httpx.Response) -> None:
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error" and "injected runner failure" in error["message"]


def test_a_failed_step_fails_its_request_and_the_others_finish_unchanged(
    faulty: Faulty, http: httpx.Client
) -> None:
    expected = _texts(http)
    before = _metrics(http)
    runner, responses = faulty.runner, {}
    failing = runner.pause_at_next_step()
    runner.fail_steps = {failing}
    threads = [_post_in_thread(http, GREEDY | {"prompt": PROMPTS["a"]}, responses, "a")]
    assert runner.paused.wait(30)  # a's prefill holds the engine; b and c queue behind it
    threads += [_post_in_thread(http, GREEDY | {"prompt": PROMPTS[k]}, responses, k) for k in "bc"]
    _wait_until(lambda: faulty.engine.num_in_flight == 3, "b and c are submitted")
    runner.resume.set()
    for thread in threads:
        thread.join(60)

    _assert_500(responses["a"])
    for key in "bc":
        assert responses[key].status_code == 200, responses[key].text
        assert responses[key].json()["choices"][0]["text"] == expected[key]
    _wait_until(lambda: _pool_is_free(faulty.engine), "every block is back in the pool")
    assert http.get("/health").status_code == 200 and faulty.engine.is_running
    after = _metrics(http)
    assert _delta(before, after, "vllm:request_success_total[error]") == 1
    assert _delta(before, after, "vllm:request_success_total[length]") == 2
    assert _delta(before, after, "vllm:request_success_total[abort]") == 0
    assert (
        http.post(C, json=GREEDY | {"prompt": PROMPTS["a"]}).json()["choices"][0]["text"]
        == (expected["a"])
    )


def test_a_step_failing_mid_stream_ends_the_stream_with_an_error_event(
    faulty: Faulty, http: httpx.Client
) -> None:
    expected = _texts(http)
    runner, responses = faulty.runner, {}
    first = runner.num_steps  # a's prefill runs; its first decode pauses, then fails
    runner.pause_before, runner.fail_steps = first + 1, {first + 1}
    runner.paused.clear()
    runner.resume.clear()
    body = GREEDY | {"prompt": PROMPTS["a"], "stream": True, "max_tokens": 20}
    with http.stream("POST", C, json=body) as response:
        assert response.status_code == 200
        lines = (line for line in response.iter_lines() if line)
        chunk = json.loads(next(lines).removeprefix("data: "))
        assert chunk["choices"][0]["finish_reason"] is None
        assert runner.paused.wait(30)
        thread = _post_in_thread(http, GREEDY | {"prompt": PROMPTS["b"]}, responses, "b")
        _wait_until(lambda: faulty.engine.num_in_flight == 2, "b is submitted")
        runner.resume.set()
        rest = list(lines)
    thread.join(60)

    *_, error_event, done = rest
    assert done == "data: [DONE]"
    error = json.loads(error_event.removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and "injected runner failure" in error["message"]
    assert responses["b"].status_code == 200
    assert responses["b"].json()["choices"][0]["text"] == expected["b"]
    _wait_until(lambda: _pool_is_free(faulty.engine), "every block is back in the pool")
    assert http.get("/health").status_code == 200


def test_n_2_with_the_largest_seed_succeeds_and_seeds_outside_uint64_get_400(
    http: httpx.Client,
) -> None:
    sampled = {"model": MODEL, "prompt": PROMPTS["c"], "max_tokens": 8, "ignore_eos": True}

    def texts(**kw: int) -> list[str]:
        response = http.post(C, json=sampled | kw)
        assert response.status_code == 200, response.text
        return [c["text"] for c in response.json()["choices"]]

    both = texts(n=2, seed=2**64 - 1)
    # Completion i is seeded with (seed + i) mod 2**64: the second one with 0.
    assert both == texts(seed=2**64 - 1) + texts(seed=0)
    assert http.get("/health").status_code == 200
    for seed in (2**64, -1):
        response = http.post(C, json=sampled | {"seed": seed})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "seed"


def test_a_request_aborted_before_its_first_token_is_counted_as_abort(
    faulty: Faulty, http: httpx.Client
) -> None:
    before = _metrics(http)
    runner = faulty.runner
    runner.pause_at_next_step()
    try:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up during the prefill
            http.post(C, json=GREEDY | {"prompt": PROMPTS["b"]}, timeout=0.5)
        _wait_until(lambda: faulty.engine.num_in_flight == 0, "the server drops the request")
    finally:
        runner.resume.set()
    _wait_until(lambda: _pool_is_free(faulty.engine), "every block is back in the pool")
    after = _metrics(http)
    assert _delta(before, after, "vllm:request_success_total[abort]") == 1
    assert _delta(before, after, "vllm:request_success_total[length]") == 0
    assert _delta(before, after, "vllm:time_to_first_token_seconds_count") == 0


def test_only_failed_steps_in_a_row_kill_the_engine(
    tiny_llama_engine: Path, running_server: ServerFactory
) -> None:
    with (
        _serve(running_server, tiny_llama_engine, max_consecutive_step_failures=2) as served,
        httpx.Client(base_url=served.server.url, timeout=60) as http,
    ):
        body = GREEDY | {"prompt": PROMPTS["a"]}
        for fail in (True, False, True):  # a success in between resets the count
            served.runner.fail_all = fail
            response = http.post(C, json=body)
            if fail:
                _assert_500(response)
            else:
                assert response.status_code == 200
            assert http.get("/health").status_code == 200
        _assert_500(http.post(C, json=body))  # the second failed step in a row
        _wait_until(lambda: not served.engine.is_running, "the engine stops")
        assert http.get("/health").status_code == 503
        assert http.get("/ready").status_code == 503
        dead = http.post(C, json=body)
        assert dead.status_code == 503 and dead.json()["error"]["code"] == "engine_dead"
        assert "2 failed steps in a row" in dead.json()["error"]["message"]
        counts = _metrics(http)
        assert counts["vllm:request_success_total[error]"] == 3
        assert counts["vllm:request_success_total[length]"] == 1


def test_a_500_keeps_the_keep_alive_connection_open(faulty: Faulty) -> None:
    """Starlette's catch-all handler sends the 500 and re-raises, and uvicorn then closes the
    connection: the client's next request on it was reset. One connection, used three times."""
    runner = faulty.runner
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(base_url=faulty.server.url, timeout=60, limits=one) as http:
        assert http.get("/health").status_code == 200
        runner.fail_steps = {runner.num_steps}
        _assert_500(http.post(C, json=GREEDY | {"prompt": PROMPTS["a"]}))
        response = http.post(C, json=GREEDY | {"prompt": PROMPTS["b"]})
        assert response.status_code == 200, response.text
    with httpx.Client(base_url=faulty.server.url, timeout=60, limits=one) as http:
        failure = http.get("/unexpected-failure")
        assert failure.status_code == 500 and failure.json()["error"]["type"] == "server_error"
        assert http.get("/health").status_code == 200


@pytest.fixture(scope="module", autouse=True)
def _a_route_with_a_bug(faulty: Faulty) -> None:
    def unexpected() -> None:
        raise RuntimeError("a bug in a route")

    faulty.server.app.add_api_route("/unexpected-failure", unexpected)
