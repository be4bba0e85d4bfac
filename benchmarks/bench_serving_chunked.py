"""Chunked prefill through the server: inter-token latency of 8 decoding streams, alone and while
a 2,000-token prompt arrives, with a small step token budget (chunked) and with one that takes the
whole prompt in one step.

    python benchmarks/bench_serving_chunked.py --engine engines/gemma-3-270m-cpu-float32-none \
        --json chunked.json

For each budget B in ``--budgets`` (default: 128, and the long prompt plus one token per stream,
i.e. no chunking) one ``llmc serve --max-num-batched-tokens B`` runs two phases:

- *alone*: ``--streams`` (8) streamed requests of ``--stream-prompt-len`` (32) token ids and
  ``--stream-output-len`` (128) greedy tokens (EOS ignored), sent at once;
- *with the long prompt*: the same again (new prompts), and one request of ``--long-prompt-len``
  (2000) token ids sent once the streams are decoding (after the alone phase's slowest TTFT plus
  8 of its mean ITLs).

ITL is the gap between successive streamed events of a stream, timed by the client as in
``llmc bench`` (vLLM's definition). Reported: the streams' p95 ITL alone; with the long prompt,
the p95 of the gaps that overlap the long prompt's prefill (from its send to its first token,
the window where it can stall the decodes) and of all gaps; their ratios to the alone p95. A
stream's whole-run p95 hides a single long stall (1 gap in 127), hence the window. The issue-4
target: with chunking, the window p95 stays within 3x of the alone p95.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools

import httpx
import numpy as np

from llmc.bench import BenchConfig, RequestResult, Target, first_model, send_request, summarize
from llmc.bench.dataset import BenchRequest, load_tokenizer, random_requests
from llmc.bench.report import write_engine_benchmark
from llmc.bench.server_process import ServeProcess


def prompts(tokenizer, seed: int, num: int, length: int, out: int) -> list[BenchRequest]:
    """``num`` prompts of exactly ``length`` random token ids asking for ``out`` tokens."""
    config = BenchConfig(num_prompts=num, input_len=length, output_len=out, seed=seed)
    return random_requests(config, tokenizer)


async def phase(
    target: Target, streams: list[BenchRequest], long: BenchRequest | None, delay_s: float
) -> tuple[list[RequestResult], RequestResult | None]:
    """Send the streams at once and, ``delay_s`` later, the long prompt."""
    async with httpx.AsyncClient(timeout=1800, limits=httpx.Limits(max_connections=64)) as client:

        async def delayed() -> RequestResult:
            await asyncio.sleep(delay_s)
            return await send_request(client, target, long)

        jobs = [send_request(client, target, s) for s in streams]
        results = await asyncio.gather(*jobs, *([delayed()] if long else []))
    return (list(results[: len(streams)]), results[-1] if long else None)


def event_gaps(result: RequestResult) -> list[tuple[float, float]]:
    """(previous event time, event time) of each inter-token gap, perf_counter seconds."""
    if result.ttft is None:
        return []
    times = list(itertools.accumulate([result.start + result.ttft, *result.itl]))
    return list(itertools.pairwise(times))


def p95_ms(gaps_s: list[float]) -> float | None:
    """95th percentile of gaps given in seconds, in milliseconds; None for no gaps."""
    return float(np.percentile(np.asarray(gaps_s) * 1e3, 95)) if gaps_s else None


def run_budget(args: argparse.Namespace, tokenizer, budget: int) -> dict:
    """Both phases (alone, with the long prompt) against one ``llmc serve
    --max-num-batched-tokens budget``; returns their ITL figures (ms) and ratios."""
    serve_args = ["--max-num-batched-tokens", str(budget)]
    with ServeProcess(args.engine, serve_args) as server:
        target = Target(server.url, first_model(server.url), ignore_eos=True)
        asyncio.run(phase(target, prompts(tokenizer, 99, 1, 16, 4), None, 0))  # warm-up
        alone_req = prompts(tokenizer, 1, args.streams, args.stream_prompt_len,
                            args.stream_output_len)  # fmt: skip
        alone, _ = asyncio.run(phase(target, alone_req, None, 0))
        alone_sum = summarize(alone, 1.0)
        delay = max(r.ttft or 0 for r in alone) + 8 * alone_sum.itl_ms.mean / 1e3
        with_req = prompts(tokenizer, 2, args.streams, args.stream_prompt_len,
                           args.stream_output_len)  # fmt: skip
        long_req = prompts(tokenizer, 3, 1, args.long_prompt_len, 4)[0]
        streams, long = asyncio.run(phase(target, with_req, long_req, delay))
    assert long is not None
    failed = [r.error for r in [*alone, *streams, long] if not r.success]
    window = (long.start, long.start + (long.ttft or 0))
    gaps = [g for r in streams for g in event_gaps(r)]
    in_window = [b - a for a, b in gaps if b > window[0] and a < window[1]]
    # Were all streams decoding over the whole window (first token before, last after)?
    overlap = all(
        r.ttft is not None and r.latency is not None
        and r.start + r.ttft < window[0] and r.start + r.latency > window[1]
        for r in streams
    )  # fmt: skip
    alone_p95 = alone_sum.itl_ms.percentiles["p95"]
    window_p95, all_p95 = p95_ms(in_window), p95_ms([b - a for a, b in gaps])
    return {
        "max_num_batched_tokens": budget,
        "failed": failed,
        "alone_itl_p95_ms": alone_p95,
        "alone_itl_mean_ms": alone_sum.itl_ms.mean,
        "long_prompt_sent_after_s": delay,
        "long_prompt_ttft_ms": None if long.ttft is None else 1e3 * long.ttft,
        "streams_decoding_over_window": overlap,
        "window_gaps": len(in_window),
        "window_itl_p95_ms": window_p95,
        "window_itl_max_ms": 1e3 * max(in_window) if in_window else None,
        "with_long_itl_p95_ms": all_p95,
        "window_p95_ratio": window_p95 / alone_p95 if window_p95 and alone_p95 else None,
        "all_p95_ratio": all_p95 / alone_p95 if all_p95 and alone_p95 else None,
    }


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, help="engine directory")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-prompt-len", type=int, default=32)
    parser.add_argument("--stream-output-len", type=int, default=128)
    parser.add_argument("--long-prompt-len", type=int, default=2000)
    parser.add_argument(
        "--budgets",
        default=None,
        help="comma-separated --max-num-batched-tokens values (default: 128 and the long prompt "
        "plus one token per stream)",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    budgets = (
        [int(b) for b in args.budgets.split(",")]
        if args.budgets
        else [128, args.long_prompt_len + args.streams]
    )
    tokenizer = load_tokenizer(args.engine)
    runs = [run_budget(args, tokenizer, b) for b in budgets]
    for run in runs:
        print(
            f"budget {run['max_num_batched_tokens']:5d}: ITL p95 alone "
            f"{run['alone_itl_p95_ms']:.1f} ms; with the long prompt: window p95 "
            f"{run['window_itl_p95_ms'] or 0:.1f} ms "
            f"({run['window_p95_ratio'] or 0:.2f}x, {run['window_gaps']} gaps, max "
            f"{run['window_itl_max_ms'] or 0:.0f} ms), whole-run p95 "
            f"{run['with_long_itl_p95_ms'] or 0:.1f} ms ({run['all_p95_ratio'] or 0:.2f}x); "
            f"long TTFT {run['long_prompt_ttft_ms'] or 0:.0f} ms; streams decoding over the "
            f"window: {run['streams_decoding_over_window']}; failed: {run['failed'] or 'none'}"
        )
    if args.json:
        write_engine_benchmark(args.json, "bench_serving_chunked", args, runs)


if __name__ == "__main__":
    main()
