"""Load check: 200 streamed requests at 32 concurrency against the real server (uvicorn
on 127.0.0.1, tiny cpu engine run by ONNX Runtime), random prompt and output lengths, 10% of the
clients hanging up after two events.

Checked: every request that was not dropped finishes with exactly the tokens it asked for
(``ignore_eos``), its own usage (every (prompt length, max_tokens) pair is distinct, so a response
delivered to the wrong client would show), one response id per request; the server aborts only
dropped requests, most of them (one can finish before its hang-up is read), counts every request
once (by finish reason) and every prompt token once; afterwards no request is running or waiting
and every KV block is free (engine statistics and the ``vllm:kv_cache_usage_perc`` gauge).
Throughput and p95 TTFT are printed (``-s``), not asserted.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmc.bench import BenchRequest, Target, run_requests, summarize
from tests.bench.test_bench import MAX_MODEL_LEN

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

MODEL = "tiny-llama"
NUM_REQUESTS = 200
CONCURRENCY = 32
NUM_DROPPED = NUM_REQUESTS // 10
NUM_BLOCKS = 256  # 32 sequences of 128 tokens in blocks of 16: room for all, no preemption


@pytest.fixture(scope="module")
def served(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    from llmc.runtime.engine import LLMEngine

    llm_engine = LLMEngine.from_engine_dir(
        tiny_llama_engine, num_blocks=NUM_BLOCKS, max_num_seqs=CONCURRENCY
    )
    with running_server(llm_engine, MODEL, max_waiting=2 * CONCURRENCY) as server:
        yield server


def _requests(seed: int = 0) -> list[BenchRequest]:
    """200 requests with distinct (prompt length, max_tokens) pairs and distinct random prompts;
    every tenth hangs up after two events while asking for many tokens (so it is still running)."""
    rng = random.Random(seed)
    short = [(p, o) for p in range(4, 41) for o in range(1, 33)]
    long = [(p, o) for p in range(4, 25) for o in range(80, MAX_MODEL_LEN - 24)]
    pairs = rng.sample(short, NUM_REQUESTS - NUM_DROPPED) + rng.sample(long, NUM_DROPPED)
    requests = [
        BenchRequest([rng.randrange(10, 500) for _ in range(p)], p, o)
        for p, o in pairs[:-NUM_DROPPED]
    ]
    requests += [
        BenchRequest([rng.randrange(10, 500) for _ in range(p)], p, o, disconnect_after=2)
        for p, o in pairs[-NUM_DROPPED:]
    ]
    rng.shuffle(requests)
    return requests


def _metric(url: str, name: str, **labels: str) -> float | None:
    """Sum of a metric's samples on /metrics whose labels include ``labels``; None when the
    server exports no such sample."""
    text = httpx.get(url + "/metrics", timeout=10).text
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]
    return sum(values) if values else None


def test_load_200_requests_32_concurrent_10_percent_dropped(served: LiveServer) -> None:
    requests = _requests()
    target = Target(served.url, MODEL, ignore_eos=True)
    results, duration = asyncio.run(run_requests(target, requests, max_concurrency=CONCURRENCY))

    kept = [(q, r) for q, r in zip(requests, results, strict=True) if q.disconnect_after is None]
    dropped = [r for q, r in zip(requests, results, strict=True) if q.disconnect_after]
    assert len(kept) == NUM_REQUESTS - NUM_DROPPED and len(dropped) == NUM_DROPPED
    for request, result in kept:
        assert result.success, (result.error, result.error_detail)
        assert (result.prompt_tokens, result.output_tokens, result.finish_reason) == (
            request.prompt_len,
            request.output_len,
            "length",
        )
    assert all(r.disconnected and r.error is None for r in dropped)
    ids = [r.response_id for r in results]
    assert None not in ids and len(set(ids)) == NUM_REQUESTS

    # The server side: only dropped requests were aborted, most of them. A dropped request can
    # finish in the engine before the server reads its hang-up (tokens are generated ahead of
    # the client's reading); it is then not aborted, and it counts by length only if its
    # stream delivered the last output before the hang-up. Nothing is left running; every
    # request was counted once; every block is back in the pool.
    deadline = time.monotonic() + 30
    while served.engine.num_running or served.engine.num_waiting:
        assert time.monotonic() < deadline, (
            f"the server did not settle: {served.engine.num_running} running, "
            f"{served.engine.num_waiting} waiting, {len(served.aborted)} aborted"
        )
        time.sleep(0.01)
    aborted = set(served.aborted)
    assert len(aborted) == len(served.aborted) <= NUM_DROPPED
    assert aborted <= {r.response_id for r in dropped}
    assert len(aborted) > NUM_DROPPED // 2, f"only {len(aborted)} of {NUM_DROPPED} aborted"
    assert not served.llm_engine.has_unfinished_requests()
    success = "vllm:request_success_total"
    by_length = _metric(served.url, success, finished_reason="length")
    assert by_length is not None and len(kept) <= by_length <= NUM_REQUESTS - len(aborted)
    assert _metric(served.url, success, finished_reason="abort") == NUM_REQUESTS - by_length
    assert _metric(served.url, success) == NUM_REQUESTS
    assert _metric(served.url, "vllm:prompt_tokens_total") == sum(q.prompt_len for q in requests)
    generated = _metric(served.url, "vllm:generation_tokens_total")
    kept_tokens = sum(q.output_len for q, _ in kept)
    dropped_tokens = sum(q.output_len for q in requests if q.disconnect_after)
    assert generated is not None and kept_tokens < generated < kept_tokens + dropped_tokens
    stats = served.llm_engine.stats()
    assert (stats.num_running, stats.num_waiting) == (0, 0)
    assert (stats.num_free_blocks, stats.kv_cache_usage) == (NUM_BLOCKS, 0.0)
    assert _metric(served.url, "vllm:kv_cache_usage_perc") == 0.0
    assert _metric(served.url, "vllm:num_requests_running") == 0.0

    summary = summarize(results, duration)
    print(
        f"\nload: {summary.completed} completed, {summary.disconnected} dropped "
        f"({len(aborted)} aborted) in "
        f"{duration:.2f} s; {summary.request_throughput:.1f} req/s, "
        f"{summary.output_throughput:.0f} output tok/s; TTFT p50 "
        f"{summary.ttft_ms.percentiles['p50']:.0f} ms, p95 {summary.ttft_ms.percentiles['p95']:.0f}"
        f" ms; peak concurrency {summary.max_concurrency_seen}"
    )
