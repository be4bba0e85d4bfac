"""Engine replicas on Ray Serve: throughput, TTFT and prefix-cache hit rate of one ``llmc serve``
process, one Ray Serve replica, and two replicas routed by Ray's power of two choices and by
llmc's prefix-aware router, on a workload whose prompts are half shared prefix.

    python benchmarks/bench_ray_replicas.py --engine engines/gemma-3-270m-cpu-int8-... \
        --json ray.json

Workload: ``--num-requests`` (48) requests to ``/v1/completions``, each one of ``--groups`` (16)
system prompts of ``--prefix-len`` (256) token ids and then ``--suffix-len`` (256) ids of its own
(random words from llmc.bench's word list, tokenized with the engine's tokenizer and sent as
token ids, so the lengths are exact), the groups interleaved; ``--output-len`` (16) greedy tokens
with EOS ignored, ``--max-concurrency`` (4) in flight. One warm-up request per server runs first
(not timed). The servers are ``llmc serve`` child processes (``--num-replicas``,
``--no-prefix-routing``); the hit rate is ``vllm:prefix_cache_hits`` over
``vllm:prefix_cache_queries`` from the server's ``/metrics`` (summed over the replicas).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import replace

from llmc.bench import BenchConfig, Target, first_model, run_requests, summarize
from llmc.bench.dataset import BenchRequest, load_tokenizer, random_requests
from llmc.bench.report import write_engine_benchmark
from llmc.bench.server_process import ServeProcess

SERVERS = {
    "one process": [],
    "1 replica": ["--num-replicas", "1"],
    "2 replicas, power of two": ["--num-replicas", "2", "--no-prefix-routing"],
    "2 replicas, prefix-aware": ["--num-replicas", "2"],
}


def make_requests(args: argparse.Namespace) -> tuple[BenchRequest, list[BenchRequest]]:
    """The warm-up request and the measured ones: the groups' requests interleaved."""
    tokenizer = load_tokenizer(args.engine)
    per_group = args.num_requests // args.groups
    config = BenchConfig(
        num_prompts=per_group,
        prefix_len=args.prefix_len,
        input_len=args.suffix_len,
        output_len=args.output_len,
    )
    groups = [
        random_requests(replace(config, seed=args.seed + g), tokenizer) for g in range(args.groups)
    ]
    measured = [group[i] for i in range(per_group) for group in groups]
    warmup = random_requests(replace(config, num_prompts=1, seed=args.seed + 1000), tokenizer)
    return warmup[0], measured


def run_server(
    args: argparse.Namespace, serve_args: list[str], warmup: BenchRequest, requests: list
) -> dict:
    """One server: warm up, send the requests, read the prefix-cache counters."""
    with ServeProcess(args.engine, serve_args, startup_timeout_s=600) as server:
        target = Target(server.url, first_model(server.url), ignore_eos=True)
        asyncio.run(run_requests(target, [warmup]))
        queries0 = server.metric("vllm:prefix_cache_queries_total") or 0.0
        hits0 = server.metric("vllm:prefix_cache_hits_total") or 0.0
        results, duration = asyncio.run(
            run_requests(target, requests, max_concurrency=args.max_concurrency)
        )
        queries = server.metric("vllm:prefix_cache_queries_total") or 0.0
        hits = server.metric("vllm:prefix_cache_hits_total") or 0.0
    summary = summarize(results, duration)
    hit_rate = (hits - hits0) / (queries - queries0) if queries > queries0 else None
    return {
        "serve_args": serve_args,
        "completed": summary.completed,
        "failed": summary.failed,
        "output_tok_s": summary.output_throughput,
        "mean_ttft_ms": summary.ttft_ms.mean,
        "p50_ttft_ms": summary.ttft_ms.percentiles["p50"],
        "prefix_cache_hit_rate": hit_rate,
        "duration_s": duration,
    }


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, help="engine directory")
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--groups", type=int, default=16, help="distinct shared prefixes")
    parser.add_argument("--prefix-len", type=int, default=256, help="shared prefix, tokens")
    parser.add_argument("--suffix-len", type=int, default=256, help="own part of each prompt")
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--max-concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", choices=list(SERVERS), help="run these servers")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    warmup, requests = make_requests(args)
    runs = {}
    for name in args.only or SERVERS:
        runs[name] = run_server(args, SERVERS[name], warmup, requests)
        run, rate = runs[name], runs[name]["prefix_cache_hit_rate"]
        print(
            f"{name:26s} {run['output_tok_s']:7.1f} output tok/s  mean TTFT "
            f"{run['mean_ttft_ms']:8.1f} ms  p50 {run['p50_ttft_ms']:8.1f} ms  completed "
            f"{run['completed']} failed {run['failed']}"
            + ("" if rate is None else f"  prefix-cache hit rate {rate:.1%}"),
            flush=True,
        )
    if args.json:
        write_engine_benchmark(args.json, "bench_ray_replicas", args, runs, cpus=os.cpu_count())


if __name__ == "__main__":
    main()
