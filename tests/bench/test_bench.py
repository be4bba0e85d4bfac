"""``llmc bench`` against the real server (uvicorn on 127.0.0.1 over a tiny cpu engine run by
ONNX Runtime), through the Python API and the command line; plus its statistics on hand-made
results.

Expected token counts come from the requests (prompts sent as token ids, ``ignore_eos``), not from
the benchmark's own output.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from llmc.bench import (
    BenchConfig,
    BenchConfigError,
    BenchRequest,
    BenchTargetError,
    RequestResult,
    Target,
    run_bench,
    run_requests,
    summarize,
)
from llmc.bench.dataset import random_requests
from llmc.bench.runner import arrival_offsets
from llmc.cli import main

if TYPE_CHECKING:
    from tests.conftest import ServerFactory

MODEL = "tiny-llama"
KEY = "sesame"
MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def url(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[str]:
    """The real server, with an API key, over the tiny engine."""
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=64)
    with running_server(engine, MODEL, max_waiting=64, api_key=KEY) as server:
        yield server.url


def test_python_api_counts_requests_and_tokens(url: str, tiny_llama_engine: Path) -> None:
    config = BenchConfig(
        base_url=url,
        api_key=KEY,
        num_prompts=6,
        input_len=10,
        output_len=5,
        tokenizer=str(tiny_llama_engine),
        ignore_eos=True,
        max_concurrency=3,
    )
    run = run_bench(config)
    assert run.model == MODEL  # the first (only) model of /v1/models
    result = run.result
    assert (result.completed, result.failed, result.disconnected, result.errors) == (6, 0, 0, {})
    assert (result.total_input_tokens, result.total_output_tokens) == (6 * 10, 6 * 5)
    assert [(r.prompt_tokens, r.output_tokens, r.finish_reason) for r in run.requests] == [
        (10, 5, "length")
    ] * 6
    assert len({r.response_id for r in run.requests}) == 6
    assert 1 <= result.max_concurrency_seen <= 3
    assert result.ttft_ms.count == result.e2el_ms.count == result.tpot_ms.count == 6
    # The engine may hand several tokens to one event: at most 4 gaps per 5-token request.
    assert result.itl_ms.count == sum(len(r.itl) for r in run.requests) <= 6 * 4
    for r in run.requests:
        assert r.latency is not None and r.ttft is not None and 0 < r.ttft <= r.latency
    for stats in (result.ttft_ms, result.tpot_ms, result.e2el_ms):
        p = stats.percentiles
        assert 0 < p["p50"] <= p["p95"] <= p["p99"]
    assert result.output_throughput == pytest.approx(30 / result.duration_s)
    assert result.request_throughput == pytest.approx(6 / result.duration_s)


def test_chat_endpoint_with_random_words(url: str, tiny_llama_engine: Path) -> None:
    from transformers import AutoTokenizer

    config = BenchConfig(
        base_url=url,
        api_key=KEY,
        model=MODEL,
        endpoint="chat",
        num_prompts=4,
        input_len=8,
        output_len=3,
        range_ratio=0.5,
        ignore_eos=True,
        request_rate=40.0,
    )
    run = run_bench(config)
    assert (run.result.completed, run.result.failed) == (4, 0)
    # The server's prompt is the chat template around the words; count it independently.
    tok = AutoTokenizer.from_pretrained(tiny_llama_engine / "tokenizer")
    requests = random_requests(config)
    prompts = [r.prompt for r in requests]
    expected = [
        len(
            tok.encode(
                tok.apply_chat_template(
                    [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
                ),
                add_special_tokens=False,
            )
        )
        for p in prompts
    ]
    assert [r.prompt_tokens for r in run.requests] == expected
    assert [r.output_tokens for r in run.requests] == [r.output_len for r in requests]
    assert all(4 <= len(str(p).split()) <= 12 for p in prompts)  # 8 words +- 50%
    assert all(1 <= r.output_len <= 4 for r in requests)  # 3 tokens +- 50%


def test_wrong_api_key_counts_errors(url: str) -> None:
    config = BenchConfig(base_url=url, api_key="wrong", model=MODEL, num_prompts=3, output_len=2)
    run = run_bench(config)
    assert (run.result.completed, run.result.failed, run.result.errors) == (0, 3, {"http_401": 3})
    assert run.result.ttft_ms.count == 0 and run.result.total_output_tokens == 0
    # Without --model the run needs /v1/models, which refuses the key: a user error.
    no_model = BenchConfig(base_url=url, api_key="wrong", num_prompts=1)
    with pytest.raises(BenchTargetError, match="--api-key"):
        run_bench(no_model)


def test_over_long_prompt_and_unreachable_server_are_errors(url: str) -> None:
    target = Target(url, MODEL, api_key=KEY, ignore_eos=True)
    requests = [BenchRequest([5] * 100, 100, 50), BenchRequest([5] * 4, 4, 2)]
    results, _ = asyncio.run(run_requests(target, requests))
    assert [r.error for r in results] == ["http_400", None]
    assert str(MAX_MODEL_LEN) in results[0].error_detail  # the server's own message
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    results, _ = asyncio.run(run_requests(Target(dead, MODEL), requests[1:]))
    assert results[0].error == "connect"


def test_client_disconnect_is_counted_apart(url: str) -> None:
    target = Target(url, MODEL, api_key=KEY, ignore_eos=True)
    requests = [BenchRequest([7] * 6, 6, 60, disconnect_after=1), BenchRequest([7] * 6, 6, 4)]
    results, duration = asyncio.run(run_requests(target, requests))
    assert results[0].disconnected and not results[0].success and results[0].error is None
    assert results[1].success and results[1].output_tokens == 4
    result = summarize(results, duration)
    assert (result.completed, result.failed, result.disconnected) == (1, 0, 1)


def test_cli_prints_table_and_writes_json(
    url: str, tiny_llama_engine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "To be, or not to be", "output_len": 2}, {"prompt": "Now is the winter"}]
    prompts.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "ci" / "bench.json"
    args = ["bench", "--base-url", url, "--api-key", KEY, "--prompt-file", str(prompts)]
    args += ["--num-prompts", "3", "--output-len", "5", "--ignore-eos", "--json", str(out)]
    assert main(args) == 0
    assert "TTFT" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert set(doc) == {"format_version", "model", "config", "result", "spec_decode", "requests"}
    assert doc["spec_decode"]["num_draft_tokens"] == 0  # this server does not speculate
    assert doc["model"] == MODEL and doc["config"]["api_key"] == "***"
    assert doc["config"]["request_rate"] == "inf"
    result = doc["result"]
    assert (result["completed"], result["failed"], result["errors"]) == (3, 0, {})
    assert result["total_output_tokens"] == 2 + 5 + 2  # the file cycles: line 1, 2, 1
    assert set(result["ttft_ms"]) == {"mean", "median", "std", "percentiles", "count"}
    assert set(result["ttft_ms"]["percentiles"]) == {"p50", "p95", "p99"}
    assert [r["output_tokens"] for r in doc["requests"]] == [2, 5, 2]

    # Refused requests: exit code 1, the errors in the JSON.
    args = ["bench", "--base-url", url, "--api-key", "wrong", "--model", MODEL]
    assert main([*args, "--num-prompts", "2", "--json", str(out)]) == 1
    assert json.loads(out.read_text())["result"]["errors"] == {"http_401": 2}
    # A bad option is a user error (exit code 2), before any request.
    assert main(["bench", "--base-url", url, "--range-ratio", "1.5"]) == 2
    assert "--range-ratio" in capsys.readouterr().err


def test_random_prompts_with_tokenizer_have_exact_lengths(tiny_llama_engine: Path) -> None:
    config = BenchConfig(
        num_prompts=5, input_len=12, prefix_len=4, output_len=3, tokenizer=str(tiny_llama_engine)
    )
    from llmc.bench.dataset import load_tokenizer

    requests = random_requests(config, load_tokenizer(str(tiny_llama_engine)))
    assert [len(r.prompt) for r in requests] == [16] * 5
    assert len({tuple(r.prompt[:4]) for r in requests}) == 1  # the shared prefix
    assert len({tuple(r.prompt) for r in requests}) == 5
    assert random_requests(config, load_tokenizer(str(tiny_llama_engine))) == requests  # seeded
    with pytest.raises(BenchConfigError, match="--prompt-file"):
        run_bench(BenchConfig(prompt_file=str(tiny_llama_engine / "missing.txt")))


def test_poisson_arrivals() -> None:
    assert arrival_offsets(4, float("inf"), 0) == [0.0] * 4
    offsets = arrival_offsets(4000, 20.0, seed=1)
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert offsets[0] == 0.0 and min(gaps) >= 0
    # Exponential gaps of mean 1/20 s: mean and standard deviation both 50 ms (+-5% at n=4000).
    mean = sum(gaps) / len(gaps)
    std = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert mean == pytest.approx(0.05, rel=0.05) and std == pytest.approx(0.05, rel=0.05)


def test_summary_statistics_follow_vllm_definitions() -> None:
    results = [
        RequestResult(
            success=True, start=0.0, ttft=0.1, itl=[0.02, 0.03], latency=0.2,
            prompt_tokens=10, output_tokens=5,
        ),
        RequestResult(
            success=True, start=0.05, ttft=0.3, latency=0.3, prompt_tokens=7, output_tokens=1
        ),
        RequestResult(error="http_503"),
        RequestResult(disconnected=True, start=0.0, ttft=0.01),
    ]  # fmt: skip
    s = summarize(results, duration_s=2.0)
    assert (s.completed, s.failed, s.disconnected, s.errors) == (2, 1, 1, {"http_503": 1})
    assert (s.total_input_tokens, s.total_output_tokens) == (17, 6)
    assert s.request_throughput == 1.0 and s.output_throughput == 3.0
    assert s.total_token_throughput == 11.5
    # TTFT 100 and 300 ms: linear interpolation between them.
    assert s.ttft_ms.mean == pytest.approx(200) and s.ttft_ms.percentiles["p50"] == pytest.approx(
        200
    )
    assert s.ttft_ms.percentiles["p95"] == pytest.approx(100 + 0.95 * 200)
    # TPOT only for requests of more than one token: (200 - 100) ms / 4.
    assert (s.tpot_ms.count, s.tpot_ms.mean) == (1, pytest.approx(25))
    assert (s.itl_ms.count, s.itl_ms.mean) == (2, pytest.approx(25))
    assert s.e2el_ms.percentiles["p50"] == pytest.approx(250)
    assert s.max_concurrency_seen == 2  # [0, 0.2) and [0.05, 0.35) overlap
    with pytest.raises(ValueError, match="duration_s"):
        summarize(results, 0.0)
