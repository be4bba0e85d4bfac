"""Load with hostile requests mixed in (issue 17: no request can stop the server): streaming
load at fixed concurrency, with client disconnects, against the same load plus malformed and
abusive requests; two ``llmc serve`` runs, one per load, in one benchmark run.

    python benchmarks/bench_hostile_load.py                      # the tiny Llama, built here
    python benchmarks/bench_hostile_load.py --engine engines/gemma-3-270m-cpu-float32-none \\
        --json hostile.json

Workload: ``--num-requests`` (300) streamed ``/v1/completions`` requests of exactly
``--input-len`` (32) random token ids (llmc.bench's word list through the engine's tokenizer),
``--output-len`` (32) tokens, EOS ignored, at most ``--concurrency`` (32) in flight, all sent at
once; ``--disconnect-frac`` (10%) of them close the stream after 3 chunks (llmc.bench's
``disconnect_after``). The hostile run adds ``--hostile-frac`` (5%) x num-requests hostile
requests at random places in the same queue, cycling through `HOSTILE`: malformed JSON, lone
surrogates, huge ``n``, seed 2**64-1 with n=2, thousands of stop strings, unknown fields, a
body over the cap, two Authorization headers, deep nesting, invalid UTF-8, out-of-vocabulary
ids, absurd ``max_tokens``. Without ``--engine`` the tests' tiny Llama (2 layers, hidden 64) is
built into a temporary directory (about 30 s). Servers run with an API key.

Reported per run: well-formed requests completed, deliberately disconnected, answered 5xx (or
an in-band error event), lost (neither completed nor disconnected on purpose, by error kind);
each hostile kind's statuses; whether, within 10 s of the run, no request runs or waits and no
KV block is in use (``/metrics``); TTFT p50/p99 of the completed well-formed requests (client
side, vLLM's definition) and their ratio hostile/plain. The issue's bar: 0 5xx, 0 lost, the
pool free, TTFT within 2x. Exit status 1 when a 5xx, a lost request or a busy pool was seen.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

# The tiny engine builder lives in fuzz_server.py; make the repository root importable when
# run as ``python benchmarks/bench_hostile_load.py``.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fuzz_server import build_tiny_engine  # noqa: E402
from llmc.bench import BenchConfig, RequestResult, Target, first_model, send_request  # noqa: E402
from llmc.bench.dataset import BenchRequest, load_tokenizer, random_requests  # noqa: E402
from llmc.bench.metrics import summarize  # noqa: E402
from llmc.bench.server_process import ServeProcess  # noqa: E402

API_KEY = "load-key"
AUTH = ("Authorization", f"Bearer {API_KEY}")
JSON = ("content-type", "application/json")
DISCONNECT_AFTER = 3  # content chunks read before a disconnecting client hangs up
HANG_S = 120.0  # no answer this long: the request is lost
TINY_SERVE_ARGS = ["--kv-cache-memory", "0.005"]  # 640 blocks of the tiny Llama: room for 32


def _body(model: str, **fields: object) -> bytes:
    body = {"model": model, "prompt": "Hello there", "max_tokens": 8, "stream": True} | fields
    return json.dumps(body).encode()  # ensure_ascii: lone surrogates travel as \\udxxx escapes


# name -> (model -> (raw body, headers)); each must get a 4xx, or a 200 for legal oddities.
HOSTILE = {
    "malformed json": lambda m: (b'{"model": "' + m.encode() + b'", "prompt": "hi", "str', [JSON]),
    "lone surrogates": lambda m: (_body(m, prompt="ab\ud800cd\udfff", stop=["\udc00"]), [JSON]),
    "huge n": lambda m: (_body(m, n=10**6), [JSON]),
    "seed 2**64-1, n=2": lambda m: (_body(m, seed=2**64 - 1, n=2, temperature=1.0), [JSON]),
    "10k stop strings": lambda m: (_body(m, stop=[f"s{i}" for i in range(10_000)]), [JSON]),
    "unknown fields": lambda m: (
        _body(m, **{f"x{i}": {"deep": [i, None, "\u0000"]} for i in range(200)}),
        [JSON],
    ),
    "oversized body": lambda m: (_body(m, prompt="word " * (1 << 20)), [JSON]),
    "two Authorization headers": lambda m: (
        _body(m),
        [JSON, ("Authorization", "Bearer wrong"), AUTH],
    ),
    "deeply nested json": lambda m: (b"[" * 100_000 + b"]" * 100_000, [JSON]),
    "invalid utf-8": lambda m: (b'{"model": "' + m.encode() + b'", "prompt": "\xff\xfe"}', [JSON]),
    "ids outside vocabulary": lambda m: (_body(m, prompt=[2**40, -1, 5]), [JSON]),
    "absurd max_tokens": lambda m: (_body(m, max_tokens=10**30, min_tokens=10**29), [JSON]),
}


@dataclass
class HostileResult:
    """What one hostile request got: its kind, the HTTP status (or hang/dropped), a detail."""

    kind: str
    status: str  # the HTTP status, or "hang" / "dropped"
    detail: str = ""


async def send_hostile(client: httpx.AsyncClient, url: str, model: str, kind: str) -> HostileResult:
    """Send one hostile request (adding the API key unless its headers carry their own) and
    read its whole response."""
    content, headers = HOSTILE[kind](model)
    if not any(name == "Authorization" for name, _ in headers):
        headers = [*headers, AUTH]
    try:
        response = await client.post(url + "/v1/completions", content=content, headers=headers)
    except httpx.TimeoutException:
        return HostileResult(kind, "hang")
    except httpx.TransportError as exc:
        return HostileResult(kind, "dropped", repr(exc))
    in_band = response.status_code == 200 and '"error"' in response.text
    detail = response.text[:300] if response.status_code >= 500 or in_band else ""
    return HostileResult(
        kind, f"{response.status_code}{' +error event' if in_band else ''}", detail
    )


async def run_load(
    url: str, model: str, requests: list[BenchRequest], hostile: list[str], args: argparse.Namespace
) -> tuple[list[RequestResult], list[HostileResult], float]:
    """Every request at once, at most ``args.concurrency`` in flight, hostile ones at seeded
    random places in the queue; well-formed results in ``requests``' order."""
    rng = random.Random(args.seed)
    queue: list[BenchRequest | str] = [*requests]
    for kind in hostile:
        queue.insert(rng.randrange(len(queue) + 1), kind)
    target = Target(url, model, api_key=API_KEY, ignore_eos=True)
    limit = asyncio.Semaphore(args.concurrency)
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=HANG_S, limits=limits) as client:

        async def one(item: BenchRequest | str) -> RequestResult | HostileResult:
            async with limit:
                if isinstance(item, str):
                    return await send_hostile(client, url, model, item)
                return await send_request(client, target, item)

        start = time.perf_counter()
        results = await asyncio.gather(*(one(item) for item in queue))
        duration = time.perf_counter() - start
    well_formed = [r for r in results if isinstance(r, RequestResult)]
    return well_formed, [r for r in results if isinstance(r, HostileResult)], duration


def pool_state(server: ServeProcess, wait_s: float = 10.0) -> dict[str, float | None]:
    """KV usage and running/waiting requests from ``/metrics``, once all are 0 or after
    ``wait_s`` seconds (aborts of disconnected requests reach the engine between steps)."""
    names = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")
    deadline = time.monotonic() + wait_s
    while True:
        values = {name: server.metric(name) for name in names}
        if all(v == 0 for v in values.values()) or time.monotonic() > deadline:
            return values
        time.sleep(0.1)


def make_requests(engine: str, args: argparse.Namespace) -> tuple[list[BenchRequest], list[str]]:
    """The well-formed requests (``disconnect_frac`` of them hanging up) and the hostile kinds."""
    config = BenchConfig(
        num_prompts=args.num_requests,
        input_len=args.input_len,
        output_len=args.output_len,
        seed=args.seed,
    )
    requests = random_requests(config, load_tokenizer(engine))
    rng = random.Random(args.seed)
    for i in rng.sample(range(len(requests)), round(args.disconnect_frac * len(requests))):
        request = requests[i]
        requests[i] = BenchRequest(
            request.prompt, request.prompt_len, request.output_len, DISCONNECT_AFTER
        )
    kinds = list(HOSTILE)
    hostile = [kinds[i % len(kinds)] for i in range(round(args.hostile_frac * len(requests)))]
    return requests, hostile


def run_server(
    engine: str, serve_args: list[str], requests: list[BenchRequest], hostile: list[str], args
) -> dict:
    """One ``llmc serve`` run: warm up, send the load, then read the pool state and health."""
    with ServeProcess(engine, ["--api-key", API_KEY, *serve_args]) as server:
        model = first_model(server.url, API_KEY)
        asyncio.run(run_load(server.url, model, requests[:1], [], args))  # warm-up, not counted
        well, hostile_results, duration = asyncio.run(
            run_load(server.url, model, requests, hostile, args)
        )
        pool = pool_state(server)
        health = httpx.get(server.url + "/health", timeout=10).status_code
        log_tail = server.log_tail(3000)
    summary = summarize(well, duration)
    server_errors = [r for r in well if r.error and r.error.startswith(("http_5", "stream_error"))]
    lost = [r for r in well if not r.success and not r.disconnected]
    hostile_statuses: dict[str, Counter] = {}
    for r in hostile_results:
        hostile_statuses.setdefault(r.kind, Counter())[r.status] += 1
    return {
        "requests": len(well),
        "hostile": len(hostile_results),
        "completed": summary.completed,
        "disconnected": summary.disconnected,
        "server_errors": len(server_errors),
        "lost": len(lost),
        "lost_by_error": dict(Counter(str(r.error) for r in lost)),
        "lost_examples": [f"{r.error}: {r.error_detail[:200]}" for r in lost[:5]],
        "hostile_statuses": {k: dict(v) for k, v in hostile_statuses.items()},
        "hostile_failures": [
            f"{r.kind}: {r.status} {r.detail}"
            for r in hostile_results
            if r.status[0] == "5" or not r.status[0].isdigit() or "error" in r.status
        ],
        "pool_after": pool,
        "pool_free": all(v == 0 for v in pool.values()),
        "health_after": health,
        "p50_ttft_ms": summary.ttft_ms.percentiles["p50"],
        "p99_ttft_ms": summary.ttft_ms.percentiles["p99"],
        "duration_s": duration,
        "server_log_tail": log_tail if server_errors or lost else "",
    }


def cpu_model() -> str:
    """``lscpu``'s model name (the platform's processor string where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line]
    return names[0] if names else "unknown"


def print_run(name: str, run: dict) -> None:
    """Print one run's counts, TTFT percentiles (ms) and pool state."""
    print(
        f"\n{name}: {run['requests']} well-formed + {run['hostile']} hostile in "
        f"{run['duration_s']:.1f} s\n"
        f"  completed {run['completed']}  disconnected on purpose {run['disconnected']}  "
        f"5xx {run['server_errors']}  lost {run['lost']} {run['lost_by_error'] or ''}\n"
        f"  TTFT p50 {run['p50_ttft_ms']:.1f} ms  p99 {run['p99_ttft_ms']:.1f} ms\n"
        f"  after: pool free {run['pool_free']} {run['pool_after']}  /health {run['health_after']}"
    )
    for example in run["lost_examples"]:
        print(f"  lost: {example}")
    for kind, statuses in run["hostile_statuses"].items():
        print(f"  hostile {kind:28s} {statuses}")
    for failure in run["hostile_failures"]:
        print(f"  HOSTILE FAILURE {failure}")


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", help="engine directory (default: build the tiny Llama)")
    parser.add_argument("--num-requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--disconnect-frac", type=float, default=0.10)
    parser.add_argument("--hostile-frac", type=float, default=0.05)
    parser.add_argument("--input-len", type=int, default=32, help="prompt, tokens")
    parser.add_argument("--output-len", type=int, default=32, help="max_tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    print(f"CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} cores")
    with tempfile.TemporaryDirectory() as tmp:
        engine = args.engine or str(build_tiny_engine(Path(tmp)))
        serve_args = [] if args.engine else TINY_SERVE_ARGS
        requests, hostile = make_requests(engine, args)
        runs = {
            "plain": run_server(engine, serve_args, requests, [], args),
            "hostile": run_server(engine, serve_args, requests, hostile, args),
        }
    plain, mixed = runs["plain"], runs["hostile"]
    for name, run in runs.items():
        print_run(name, run)
    ratios = {
        p: mixed[f"{p}_ttft_ms"] / plain[f"{p}_ttft_ms"] if plain[f"{p}_ttft_ms"] else None
        for p in ("p50", "p99")
    }
    print("\nTTFT hostile / plain: " + "  ".join(f"{p} {r:.2f}x" for p, r in ratios.items() if r))
    broken = any(r["server_errors"] or r["lost"] or not r["pool_free"] for r in runs.values())
    within = all(r is not None and r <= 2.0 for r in ratios.values())
    print(
        f"bar (0 5xx, 0 lost, pool free, TTFT within 2x): "
        f"{'met' if not broken and within else 'NOT met'}" + ("" if within else " (TTFT over 2x)")
    )
    for name, run in runs.items():
        if run["server_log_tail"]:
            print(f"\n{name} server log (tail):\n{run['server_log_tail']}")
    if args.json:
        doc = {
            "benchmark": "bench_hostile_load",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "cpu": cpu_model(),
            "engine": args.engine or "tiny-llama (built by the script)",
            "workload": {k: v for k, v in vars(args).items() if k not in ("engine", "json")},
            "runs": runs,
            "ttft_ratio_hostile_over_plain": ratios,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
