"""Graceful shutdown: ``llmc serve`` in its own process drains on SIGTERM (readiness false, new
requests 503, every in-flight request finishes); and in-process, requests still running at the
shutdown timeout end with finish_reason "abort" and give their KV blocks back.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tests.runtime.test_server import MODEL, _wait_until

if TYPE_CHECKING:
    from tests.conftest import ServerFactory

NUM_STREAMS = 12
KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_TOKENS = 100  # with the prompt, within the engine's max_seq_len of 128


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def _stream(url: str, body: dict, first: threading.Event, results: list) -> None:
    """Read one streamed completion; append (finish_reason, last line, tokens) to results."""
    try:
        with httpx.stream(
            "POST", url + "/v1/completions", json=body, headers=AUTH, timeout=120
        ) as response:
            lines = [line for line in response.iter_lines() if line]
            first.set()
        chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        results.append((finish[-1], lines[-1], chunks[-1]["usage"]["completion_tokens"]))
    except Exception as exc:  # reported by the test thread
        first.set()
        results.append(exc)


def _requests_seen(url: str) -> float:
    """Requests the server's engine holds or has finished: running + waiting + succeeded
    (its Prometheus metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    seen = 0.0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        if family.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            seen += sum(s.value for s in family.samples)
        elif family.name == "vllm:request_success":
            seen += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return seen


def _check_serve_flags(url: str) -> None:
    """The `llmc serve` flags reach the server: API key, body cap, CORS, no prefix caching."""
    post = url + "/v1/completions"
    body = {"model": MODEL, "prompt": list(range(10, 50)), "max_tokens": 2}
    assert httpx.post(post, json=body).status_code == 401
    assert httpx.post(post, json=body | {"prompt": "x" * 3000}, headers=AUTH).status_code == 413
    origin = {"Origin": "https://a.example"}
    models = httpx.get(url + "/v1/models", headers=AUTH | origin)
    assert models.headers["access-control-allow-origin"] == "https://a.example"
    for _ in range(2):  # the same 40-token prompt twice: two full blocks to share, if caching
        assert httpx.post(post, json=body, headers=AUTH).status_code == 200
    metrics = httpx.get(url + "/metrics").text
    assert 'vllm:prefix_cache_hits_total{model_name="tiny-llama"} 0.0' in metrics


def test_sigterm_drains_llmc_serve(tiny_llama_engine: Path) -> None:
    """``llmc serve`` in its own process (not `running_server`): the test signals it and reads
    its exit status and stderr."""
    port = _free_port()
    root = Path(__file__).resolve().parents[2]
    # Two sequences at a time: six 60-token streams take about 180 steps, so most
    # are queued or running when the signal comes.
    command = [sys.executable, "-m", "llmc.cli", "serve", str(tiny_llama_engine)]
    command += ["--port", str(port)]
    command += ["--served-model-name", MODEL, "--max-num-seqs", "1", "--shutdown-timeout", "120"]
    command += ["--no-prefix-caching", "--max-request-body-bytes", "2000"]
    command += ["--allowed-origins", "https://a.example", "--api-key", KEY]
    proc = subprocess.Popen(
        command,
        cwd=root,
        env=os.environ | {"PYTHONPATH": str(root)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_until(lambda: _status(url + "/ready") == 200, "the server is ready", 120)
        _check_serve_flags(url)
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": MAX_TOKENS, "stream": True}
        body |= {"ignore_eos": True, "stream_options": {"include_usage": True}}
        results: list = []
        first = threading.Event()
        threads = [
            threading.Thread(target=_stream, args=(url, body, first, results))
            for _ in range(NUM_STREAMS)
        ]
        base = _requests_seen(url)
        for t in threads:
            t.start()
        # Every stream accepted (queued, running or done) before the signal: a stream still
        # connecting when it comes is refused, as it should be, which is not this test.
        _wait_until(lambda: _requests_seen(url) - base >= NUM_STREAMS, "all streams in", 60)
        proc.send_signal(signal.SIGTERM)
        in_flight = sum(t.is_alive() for t in threads)
        # The signal handler runs on the server's event loop; the checks follow at once, while
        # the drain still has the queued streams to finish (a tiny engine's 100 tokens take
        # about 0.1 s: a fixed wait here let the drain end first).
        _wait_until(lambda: _status(url + "/ready") == 503, "the server drains", 10)
        refused = httpx.post(
            url + "/v1/completions", json={"model": MODEL, "prompt": "Hi"}, headers=AUTH
        )
        assert _status(url + "/health") == 200
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "server_shutting_down"
        for t in threads:
            t.join(120)
        assert in_flight > 0, results  # the drain had work to wait for
        assert results == [("length", "data: [DONE]", MAX_TOKENS)] * NUM_STREAMS
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGTERM  # uvicorn re-raises the signal after the drain
        assert "draining" in stderr and "Application shutdown complete" in stderr
        assert _status(url + "/health") is None
    finally:
        proc.kill()


def test_requests_running_at_the_shutdown_timeout_end_with_abort(
    tiny_llama_engine: Path, running_server: ServerFactory
) -> None:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    step = engine.step

    def slow_step():  # noqa: ANN202 - 60 tokens take 3 s, far past the 0.5 s timeout
        time.sleep(0.05)
        return step()

    engine.step = slow_step  # type: ignore[method-assign]
    with running_server(engine, MODEL, shutdown_timeout_s=0.5) as server:
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": MAX_TOKENS, "stream": True}
        body |= {"ignore_eos": True, "n": 2}
        completions = server.url + "/v1/completions"
        with httpx.stream("POST", completions, json=body, timeout=60) as response:
            lines = response.iter_lines()
            events = [next(lines)]
            # What uvicorn's signal handler calls.
            server.uvicorn_server.handle_exit(signal.SIGTERM, None)
            events += [line for line in lines if line]
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
        finishes = {
            c["choices"][0]["index"]: c["choices"][0]["finish_reason"]
            for c in chunks
            if c["choices"][0]["finish_reason"]
        }
        assert finishes == {0: "abort", 1: "abort"}
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == 0)
        assert text  # what was generated before the timeout is kept
        server.thread.join(30)
        assert not server.thread.is_alive()
        stats = server.engine.stats
        assert stats.num_free_blocks == stats.num_total_blocks and stats.num_running == 0
