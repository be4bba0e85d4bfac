"""How much a large constraint's compile delays a concurrent small request: the latency of a
small completion sent alone against the same completion sent 50 ms after one carrying a
``choice`` of 40,000 distinct strings, against one ``llmc serve`` run.

    python benchmarks/bench_grammar_stall.py --engine engines/gemma-3-270m-cpu-float32-int8

Workload: the small request is a streamed ``/v1/completions`` of "Hello there", ``--small-tokens``
(4) greedy tokens, EOS ignored. Each of ``--rounds`` (7) rounds sends it alone, then sends the
choice request (``--num-choices`` strings, new random ones every round so the server's compile
cache never answers; at most ``--choice-tokens`` (16) tokens) and ``--delay-ms`` (50) later the
small one. A warm-up round comes first, reported apart: the server's first constraint also
builds llguidance's tokenizer tables. The compile cost is real only with a real vocabulary:
Gemma 3's 262,144 tokens.

Reported: the small request's median latency (and TTFT) alone and after the choice, and the
ratio of the medians (the bar: at most 2x); the choice request's median TTFT (its compile and
prefill: a fair proxy for the compile) and latency. Exit status 1 when a request failed or the
ratio is over 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import string
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_hostile_load import cpu_model  # noqa: E402
from llmc.bench import first_model  # noqa: E402
from llmc.bench.server_process import ServeProcess  # noqa: E402

API_KEY = "stall-key"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@dataclass(frozen=True)
class Timing:
    """One streamed request, client side: time to the first content event and to the last,
    seconds (None when it failed), and the error (None on success)."""

    ttft: float | None
    latency: float | None
    error: str | None = None


async def timed(client: httpx.AsyncClient, url: str, body: dict) -> Timing:
    """Send ``body`` to ``/v1/completions`` (streamed) and time it."""
    start = time.perf_counter()
    ttft = last = None
    async with client.stream("POST", url + "/v1/completions", json=body, headers=HEADERS) as r:
        if r.status_code != 200:
            return Timing(None, None, f"http_{r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            data = line.removeprefix("data:").strip()
            if not line.startswith("data:") or data == "[DONE]":
                continue
            if "error" in (chunk := json.loads(data)):
                return Timing(None, None, f"error event: {data[:300]}")
            if chunk.get("choices"):
                last = time.perf_counter() - start
                ttft = last if ttft is None else ttft
    return Timing(ttft, last, None if ttft is not None else "no tokens")


def choices(rng: random.Random, num: int) -> list[str]:
    """``num`` distinct random strings of 8 lowercase letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    out: set[str] = set()
    while len(out) < num:
        out.add("".join(rng.choices(alphabet, k=8)))
    return sorted(out)


async def one_round(
    client: httpx.AsyncClient, url: str, model: str, rng: random.Random, args: argparse.Namespace
) -> tuple[Timing, Timing, Timing]:
    """The small request alone; then the choice request and, ``delay_ms`` later, the small one.
    Returns (small alone, small after the choice, the choice)."""
    small = {
        "model": model,
        "prompt": "Hello there",
        "max_tokens": args.small_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
    }
    alone = await timed(client, url, small)
    choice = small | {
        "max_tokens": args.choice_tokens,
        "ignore_eos": False,
        "structured_outputs": {"choice": choices(rng, args.num_choices)},
    }
    choice_task = asyncio.create_task(timed(client, url, choice))
    await asyncio.sleep(args.delay_ms / 1000)
    after = await timed(client, url, small)
    return alone, after, await choice_task


async def measure(url: str, model: str, args: argparse.Namespace) -> list[tuple[Timing, ...]]:
    """A warm-up round (the server's first constraint), then ``args.rounds`` counted ones."""
    rng = random.Random(args.seed)
    async with httpx.AsyncClient(timeout=300) as client:
        return [await one_round(client, url, model, rng, args) for _ in range(1 + args.rounds)]


def median_ms(values: list[float | None]) -> float | None:
    """The median in ms of the values that are not None, or None."""
    present = [v for v in values if v is not None]
    return statistics.median(present) * 1000 if present else None


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, help="engine directory (a real vocabulary)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--num-choices", type=int, default=40_000)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--small-tokens", type=int, default=4)
    parser.add_argument("--choice-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    print(f"CPU: {cpu_model()}")
    with ServeProcess(args.engine, ["--api-key", API_KEY]) as server:
        model = first_model(server.url, API_KEY)
        warm_up, *rounds = asyncio.run(measure(server.url, model, args))
    alone, after, choice = (list(column) for column in zip(*rounds, strict=True))
    names = ("small alone", "small after the choice", "choice")
    labelled = [("warm-up", warm_up), *((f"round {i + 1}", r) for i, r in enumerate(rounds))]
    failures = [
        f"{label}, {name}: {t.error}"
        for label, timings in labelled
        for name, t in zip(names, timings, strict=True)
        if t.error
    ]
    result = {
        "small_alone_latency_ms": median_ms([t.latency for t in alone]),
        "small_alone_ttft_ms": median_ms([t.ttft for t in alone]),
        "small_after_choice_latency_ms": median_ms([t.latency for t in after]),
        "small_after_choice_ttft_ms": median_ms([t.ttft for t in after]),
        "choice_ttft_ms": median_ms([t.ttft for t in choice]),
        "choice_latency_ms": median_ms([t.latency for t in choice]),
        "per_round_latency_ms": [
            [None if t.latency is None else round(t.latency * 1000, 1) for t in r] for r in rounds
        ],
        "warm_up_latency_ms": [
            None if t.latency is None else round(t.latency * 1000, 1) for t in warm_up
        ],
        "failures": failures,
    }
    base, stalled = result["small_alone_latency_ms"], result["small_after_choice_latency_ms"]
    result["ratio"] = ratio = stalled / base if base and stalled else None
    ms = {
        k: "-" if v is None else f"{v:.1f}"
        for k, v in result.items()
        if k.endswith("_ms") and not isinstance(v, list)
    }
    print(
        f"small request ({args.small_tokens} tokens), median of {args.rounds}: alone "
        f"{ms['small_alone_latency_ms']} ms (TTFT {ms['small_alone_ttft_ms']}), "
        f"{args.delay_ms:g} ms after a {args.num_choices}-string choice "
        f"{ms['small_after_choice_latency_ms']} ms (TTFT {ms['small_after_choice_ttft_ms']}): "
        f"{'-' if ratio is None else f'{ratio:.2f}'}x\n"
        f"choice request: TTFT {ms['choice_ttft_ms']} ms, latency {ms['choice_latency_ms']} ms\n"
        f"per round [alone, after, choice] latency ms: {result['per_round_latency_ms']}\n"
        f"warm-up round (not counted) latency ms: {result['warm_up_latency_ms']}"
    )
    for failure in failures:
        print(f"FAILED {failure}")
    met = ratio is not None and ratio <= 2 and not failures
    print(
        f"bar (ratio <= 2x, no failed request): {'met' if met else 'NOT met'} (ratio "
        f"{'within' if ratio is not None and ratio <= 2 else 'over'} 2x, {len(failures)} failed)"
    )
    if args.json:
        doc = {"benchmark": "bench_grammar_stall", "cpu": cpu_model(), "engine": args.engine}
        doc |= {"workload": {k: v for k, v in vars(args).items() if k != "json"}} | result
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
