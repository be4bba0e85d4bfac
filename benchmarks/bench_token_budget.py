"""The step token budget (``--max-num-batched-tokens``) and the prefill-first bound
(``--max-decode-wait-steps``) against time to first token under load: 16 simultaneous requests
through ``llmc serve``, one server per (budget, bound) pair, on one engine.

    python benchmarks/bench_token_budget.py --engine engines/gemma-3-270m-cpu-float32-int8 \\
        --budgets 128,256,512,1024,2048 --decode-waits 0,16 --json budget.json
    python benchmarks/bench_token_budget.py --engine ENGINE --pairs 512:0,256:16 --rounds 3

``--pairs`` (budget:bound) replaces the product of ``--budgets`` and ``--decode-waits``;
``--rounds`` repeats the list, interleaved, so that a slow minute of a shared host falls on
every setting alike.

Workload (``benchmarks/`` and the peers table's): ``--num-prompts`` (16) prompts of ``--input-len``
(128) random token ids, ``--output-len`` (128) greedy tokens each with EOS ignored, all sent at
once, prefix caching off. A budget below the 16 prompts' 2,048 tokens splits their prefill over
several steps (chunked prefill), so the first requests get tokens while later prompts are still
prefilled; with a bound of 0 decodes ride in the same steps, with W > 0 they wait up to W steps
while prompts are prefilled. Reported per pair: mean and p95 TTFT, mean TPOT, p99 and largest
inter-token latency (what prefill first costs the running requests), output tokens/s over the
run (vLLM's definitions, ``llmc.bench``).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from llmc.bench import BenchConfig, Target, first_model, send_request, summarize
from llmc.bench.dataset import load_tokenizer, random_requests
from llmc.bench.report import write_engine_benchmark
from llmc.bench.server_process import ServeProcess


async def burst(target: Target, requests) -> tuple[list, float]:
    """Send ``requests`` at once; (results, wall seconds until the last finished)."""
    async with httpx.AsyncClient(timeout=1800, limits=httpx.Limits(max_connections=64)) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(send_request(client, target, r) for r in requests))
        return list(results), time.perf_counter() - start


def run_budget(args: argparse.Namespace, tokenizer, budget: int, wait: int) -> dict:
    """One ``llmc serve --max-num-batched-tokens budget --max-decode-wait-steps wait``: a
    warm-up burst, then the measured one (new prompts); returns its figures."""
    serve_args = ["--max-num-batched-tokens", str(budget), "--no-prefix-caching"]
    serve_args += ["--max-decode-wait-steps", str(wait)]
    config = BenchConfig(
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        seed=1,
    )
    with ServeProcess(args.engine, serve_args) as server:
        target = Target(server.url, first_model(server.url), ignore_eos=True)
        warm = BenchConfig(num_prompts=args.num_prompts, input_len=args.input_len,
                           output_len=4, seed=99)  # fmt: skip
        asyncio.run(burst(target, random_requests(warm, tokenizer)))
        results, duration = asyncio.run(burst(target, random_requests(config, tokenizer)))
    summary = summarize(results, duration)
    return {
        "max_num_batched_tokens": budget,
        "max_decode_wait_steps": wait,
        "completed": summary.completed,
        "failed": summary.failed,
        "mean_ttft_ms": summary.ttft_ms.mean,
        "p95_ttft_ms": summary.ttft_ms.percentiles["p95"],
        "mean_tpot_ms": summary.tpot_ms.mean,
        "p99_itl_ms": summary.itl_ms.percentiles["p99"],
        "max_itl_ms": 1000.0 * max((gap for r in results for gap in r.itl), default=0.0),
        "output_tok_s": summary.output_throughput,
        "duration_s": duration,
    }


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, help="engine directory")
    parser.add_argument("--budgets", default="128,256,512,1024,2048")
    parser.add_argument("--decode-waits", default="0", help="prefill-first bounds, in steps")
    parser.add_argument("--pairs", help="budget:bound pairs, e.g. 512:0,256:16")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.engine)
    if args.pairs:
        pairs = [tuple(map(int, pair.split(":"))) for pair in args.pairs.split(",")]
    else:
        pairs = [
            (int(b), int(w)) for b in args.budgets.split(",") for w in args.decode_waits.split(",")
        ]
    runs = [run_budget(args, tokenizer, b, w) for _ in range(args.rounds) for b, w in pairs]
    print(
        "| budget | decode wait | mean TTFT ms | p95 TTFT ms | mean TPOT ms | p99 ITL ms "
        "| max ITL ms | output tok/s | failed |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(
            f"| {r['max_num_batched_tokens']} | {r['max_decode_wait_steps']} "
            f"| {r['mean_ttft_ms']:.0f} | {r['p95_ttft_ms']:.0f} | {r['mean_tpot_ms']:.1f} "
            f"| {r['p99_itl_ms']:.0f} | {r['max_itl_ms']:.0f} | {r['output_tok_s']:.0f} "
            f"| {r['failed']} |"
        )
    if args.json:
        write_engine_benchmark(args.json, "bench_token_budget", args, runs)


if __name__ == "__main__":
    main()
