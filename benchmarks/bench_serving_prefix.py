"""Prefix caching through the server: mean TTFT of requests that share a long system prompt, with
prefix caching (the default) and with ``llmc serve --no-prefix-caching``, two server runs in one
benchmark run.

    python benchmarks/bench_serving_prefix.py --engine engines/gemma-3-270m-cpu-float32-none \
        --json prefix.json

Workload: ``--num-requests`` (16) requests to ``/v1/completions``, each ``--prefix-len`` (256)
shared token ids then ``--suffix-len`` (16) ids of its own (random words from llmc.bench's word
list, tokenized with the engine's tokenizer and sent as token ids, so the lengths are exact; no
BOS), ``--output-len`` (8) greedy tokens with EOS ignored, sent ``--max-concurrency`` (1) at a
time, so every request after the first can reuse the blocks the first one filled. One warm-up
request with another prefix runs first on each server (not timed). TTFT is measured by the client
as in ``llmc bench`` (vLLM's definition). The server's ``vllm:prefix_cache_hits`` /
``vllm:prefix_cache_queries`` counters give the hit rate when the server exports them.
The issue-4 target: mean TTFT with caching at least 3x lower than without.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace

from llmc.bench import BenchConfig, Target, first_model, run_requests, summarize
from llmc.bench.dataset import BenchRequest, load_tokenizer, random_requests
from llmc.bench.report import write_engine_benchmark
from llmc.bench.server_process import ServeProcess


def make_requests(args: argparse.Namespace) -> tuple[BenchRequest, list[BenchRequest]]:
    """The warm-up request and the measured ones (shared prefix, own suffixes)."""
    tokenizer = load_tokenizer(args.engine)
    config = BenchConfig(
        num_prompts=args.num_requests,
        prefix_len=args.prefix_len,
        input_len=args.suffix_len,
        output_len=args.output_len,
        seed=args.seed,
    )
    measured = random_requests(config, tokenizer)
    warmup = random_requests(replace(config, num_prompts=1, seed=args.seed + 1), tokenizer)[0]
    return warmup, measured


def run_server(
    args: argparse.Namespace, serve_args: list[str], warmup: BenchRequest, requests: list
) -> dict:
    """One ``llmc serve`` run: warm up, send the requests, read the prefix-cache counters."""
    with ServeProcess(args.engine, serve_args) as server:
        target = Target(server.url, first_model(server.url), ignore_eos=True)
        asyncio.run(run_requests(target, [warmup]))
        queries0 = server.metric("vllm:prefix_cache_queries_total")
        hits0 = server.metric("vllm:prefix_cache_hits_total")
        results, duration = asyncio.run(
            run_requests(target, requests, max_concurrency=args.max_concurrency)
        )
        queries = server.metric("vllm:prefix_cache_queries_total")
        hits = server.metric("vllm:prefix_cache_hits_total")
    summary = summarize(results, duration)
    hit_rate = None
    if None not in (queries0, hits0, queries, hits) and queries > queries0:
        hit_rate = (hits - hits0) / (queries - queries0)
    return {
        "serve_args": serve_args,
        "completed": summary.completed,
        "failed": summary.failed,
        "errors": summary.errors,
        "mean_ttft_ms": summary.ttft_ms.mean,
        "p50_ttft_ms": summary.ttft_ms.percentiles["p50"],
        "first_ttft_ms": None if results[0].ttft is None else 1e3 * results[0].ttft,
        "ttft_ms": [None if r.ttft is None else 1e3 * r.ttft for r in results],
        "prefix_cache_hit_rate": hit_rate,
        "duration_s": duration,
    }


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, help="engine directory")
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--prefix-len", type=int, default=256, help="shared prefix, tokens")
    parser.add_argument("--suffix-len", type=int, default=16, help="own part of each prompt")
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--max-concurrency", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    warmup, requests = make_requests(args)
    runs = {
        "prefix_caching": run_server(args, [], warmup, requests),
        "no_prefix_caching": run_server(args, ["--no-prefix-caching"], warmup, requests),
    }
    cached, uncached = runs["prefix_caching"], runs["no_prefix_caching"]
    speedup = uncached["mean_ttft_ms"] / cached["mean_ttft_ms"] if cached["mean_ttft_ms"] else None
    for name, run in runs.items():
        rate = run["prefix_cache_hit_rate"]
        print(
            f"{name:18s} mean TTFT {run['mean_ttft_ms']:8.1f} ms  p50 {run['p50_ttft_ms']:8.1f} ms"
            f"  first {run['first_ttft_ms'] or 0:8.1f} ms  completed {run['completed']}"
            f"  failed {run['failed']}"
            + ("" if rate is None else f"  prefix-cache hit rate {rate:.1%}")
        )
    if speedup is not None:
        print(f"mean TTFT, no caching / caching: {speedup:.2f}x (target >= 3x)")
    if args.json:
        write_engine_benchmark(
            args.json, "bench_serving_prefix", args, runs, mean_ttft_speedup=speedup
        )


if __name__ == "__main__":
    main()
