"""Load with hostile requests mixed in (no request can stop the server): streaming load at
fixed concurrency, with client disconnects, against the same load plus malformed and abusive
requests; two ``llmc serve`` runs, one per load, in one benchmark run.

    python benchmarks/bench_hostile_load.py                      # the tiny Llama, built here
    python benchmarks/bench_hostile_load.py --engine engines/gemma-3-270m-cpu-float32-none \\
        --json hostile.json

Workload: ``--num-requests`` (300) streamed ``/v1/completions`` requests of exactly
``--input-len`` (32) random token ids (llmc.bench's word list through the engine's tokenizer),
``--output-len`` (32) tokens, EOS ignored, at most ``--concurrency`` (32) in flight, all sent at
once; ``--disconnect-frac`` (10%) of them close the stream after 3 chunks (llmc.bench's
``disconnect_after``). The hostile run adds ``--hostile-frac`` (5%) x num-requests hostile
requests, at least one of each kind, at random places in the same queue, cycling through
`HOSTILE`. Malformed and abusive bodies: malformed JSON, lone surrogates, huge ``n``, seed
2**64-1 with n=2, thousands of stop strings, unknown fields, a body over the cap, two
Authorization headers, deep nesting, invalid UTF-8, out-of-vocabulary ids, absurd
``max_tokens``. Grammar and tool abuse: a JSON schema whose required property refers to the
root, ``a{1000000}``, a ``choice`` of 2,500 and one of 40,000 strings (well-formed: served),
a grammar and a ``$ref`` cycle with no base case, a Lark grammar that passes the compile-time
probe and fails at about the tenth token, tools whose parameters use ``$defs`` (a pydantic
model nested in another, served), a ``tool_choice`` naming a missing function, and a 3.9 MiB
``/tokenize`` prompt. Each kind declares the statuses it may get. Without ``--engine`` the
tests' tiny Llama (2 layers, hidden 64) is built with a 1,024-token context (the generic tool
instructions take ~540 of its tokens) into a temporary directory (about 30 s). Servers run
with an API key.

Reported per run: well-formed requests completed, deliberately disconnected, answered 5xx (or
an in-band error event), lost (neither completed nor disconnected on purpose, by error kind);
each hostile kind's statuses, and any status outside the kind's expected ones; whether, within
10 s of the run, no request runs or waits and no KV block is in use (``/metrics``); TTFT p50/p99
of the completed well-formed requests (client side, vLLM's definition) and their ratio
hostile/plain. The bar: 0 5xx, 0 lost, the pool free, TTFT within 2x, every hostile request
answered as its kind expects. Exit status 1 when a 5xx, a lost request, a busy pool, a
``/health`` other than 200 or an unexpected hostile answer was seen.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

# The tiny model lives in the tests; make the repository root importable when run as
# ``python benchmarks/bench_hostile_load.py``.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
# The generic tool format's instructions and a short question take ~540 tokens of the tiny
# tokenizer (512 ids), past the tests' 128-token context.
TINY_MAX_SEQ_LEN = 1024


Headers = list[tuple[str, str]]


def _body(model: str, **fields: object) -> bytes:
    body = {"model": model, "prompt": "Hello there", "max_tokens": 8, "stream": True} | fields
    return json.dumps(body).encode()  # ensure_ascii: lone surrogates travel as \\udxxx escapes


def _constrained(model: str, max_tokens: int = 8, **constraint: object) -> bytes:
    """A streamed completion under ``structured_outputs`` (vLLM's extra body)."""
    return _body(model, max_tokens=max_tokens, structured_outputs=constraint)


def _choices(num: int) -> list[str]:
    """``num`` distinct strings (at most 14 characters: 40,000 fit the 1 MiB constraint bound)."""
    return [f"opt{i:05d}-{i * 7919 % 100_003:x}" for i in range(num)]


# A pydantic model nested in another, as ``Person.model_json_schema()`` writes it.
_PERSON_TOOL = {
    "type": "function",
    "function": {
        "name": "add_person",
        "description": "Add a person to the address book.",
        "parameters": {
            "$defs": {
                "Address": {
                    "properties": {
                        "street": {"title": "Street", "type": "string"},
                        "city": {"title": "City", "type": "string"},
                    },
                    "required": ["street", "city"],
                    "title": "Address",
                    "type": "object",
                }
            },
            "properties": {
                "name": {"title": "Name", "type": "string"},
                "address": {"$ref": "#/$defs/Address"},
            },
            "required": ["name", "address"],
            "title": "Person",
            "type": "object",
        },
    },
}


def _tool_call(model: str, function: str) -> bytes:
    """A streamed chat completion that must call ``function`` of ``_PERSON_TOOL``."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Add Ann, who lives at 1 Main St, Springfield."}],
        "tools": [_PERSON_TOOL],
        "tool_choice": {"type": "function", "function": {"name": function}},
        "max_tokens": 32,
        "stream": True,
    }
    return json.dumps(body).encode()


@dataclass(frozen=True)
class Hostile:
    """One kind of hostile request.

    Attributes:
        make: the raw body and its headers, for the served model's name.
        expect: the answers it may get: an HTTP status, or "200 +error event" for a stream that
            ends in an in-band error event; any other answer is a failure.
        path: the route it is posted to.
    """

    make: Callable[[str], tuple[bytes, Headers]]
    expect: frozenset[str] = frozenset({"400"})
    path: str = "/v1/completions"


_SERVED = frozenset({"200"})
_LATE_FAILURE = frozenset({"400", "200 +error event"})
# 10 one-character symbols, then a tail with no base case: the compile-time probe (4 tokens)
# passes, the request fails some tokens later (about the tenth with one character a token).
_LATE_GRAMMAR = 'start: c c c c c c c c c c tail\nc: "x" | "z"\ntail: "a" tail\n'
_REF_CYCLE = {
    "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
    "$ref": "#/$defs/A",
}
_SELF_REQUIRED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}

HOSTILE = {
    "malformed json": Hostile(
        lambda m: (b'{"model": "' + m.encode() + b'", "prompt": "hi", "str', [JSON])
    ),
    "lone surrogates": Hostile(
        lambda m: (_body(m, prompt="ab\ud800cd\udfff", stop=["\udc00"]), [JSON])
    ),
    "huge n": Hostile(lambda m: (_body(m, n=10**6), [JSON])),
    "seed 2**64-1, n=2": Hostile(
        lambda m: (_body(m, seed=2**64 - 1, n=2, temperature=1.0), [JSON]), _SERVED
    ),
    "10k stop strings": Hostile(
        lambda m: (_body(m, stop=[f"s{i}" for i in range(10_000)]), [JSON])
    ),
    "unknown fields": Hostile(
        lambda m: (_body(m, **{f"x{i}": {"deep": [i, None, "\u0000"]} for i in range(200)}), [JSON])
    ),
    "oversized body": Hostile(
        lambda m: (_body(m, prompt="word " * (1 << 20)), [JSON]), frozenset({"413"})
    ),
    "two Authorization headers": Hostile(
        lambda m: (_body(m), [JSON, ("Authorization", "Bearer wrong"), AUTH]),
        frozenset({"400", "401"}),
    ),
    "deeply nested json": Hostile(lambda m: (b"[" * 100_000 + b"]" * 100_000, [JSON])),
    "invalid utf-8": Hostile(
        lambda m: (b'{"model": "' + m.encode() + b'", "prompt": "\xff\xfe"}', [JSON])
    ),
    "ids outside vocabulary": Hostile(lambda m: (_body(m, prompt=[2**40, -1, 5]), [JSON])),
    "absurd max_tokens": Hostile(
        lambda m: (_body(m, max_tokens=10**30, min_tokens=10**29), [JSON])
    ),
    "json schema, required self-$ref": Hostile(
        lambda m: (_constrained(m, json=_SELF_REQUIRED), [JSON])
    ),
    "regex a{1000000}": Hostile(lambda m: (_constrained(m, regex="a{1000000}"), [JSON])),
    "choice of 2,500": Hostile(
        lambda m: (_constrained(m, choice=_choices(2_500)), [JSON]), _SERVED
    ),
    "choice of 40,000": Hostile(
        lambda m: (_constrained(m, choice=_choices(40_000)), [JSON]), _SERVED
    ),
    "grammar with no base case": Hostile(
        lambda m: (_constrained(m, grammar='root ::= "a" root'), [JSON])
    ),
    "$ref cycle, no base case": Hostile(lambda m: (_constrained(m, json=_REF_CYCLE), [JSON])),
    "grammar failing late": Hostile(
        lambda m: (_constrained(m, 32, grammar=_LATE_GRAMMAR), [JSON]), _LATE_FAILURE
    ),
    "tools with $defs": Hostile(
        lambda m: (_tool_call(m, "add_person"), [JSON]), _SERVED, "/v1/chat/completions"
    ),
    "tool_choice of a missing function": Hostile(
        lambda m: (_tool_call(m, "remove_person"), [JSON]), path="/v1/chat/completions"
    ),
    "3.9 MiB /tokenize prompt": Hostile(
        lambda m: (json.dumps({"model": m, "prompt": "word " * 817_000}).encode(), [JSON]),
        path="/tokenize",
    ),
}


@dataclass
class HostileResult:
    """What one hostile request got: its kind, the answer (HTTP status, "200 +error event",
    "hang" or "dropped"), whether its kind expects that answer, and the body unless a 200."""

    kind: str
    status: str
    expected: bool
    detail: str = ""


def _error_event(text: str) -> str | None:
    """An SSE body's first error event (a ``data:`` line holding an ``error`` object, or one
    that is not JSON), or None."""
    for line in text.splitlines():
        data = line.removeprefix("data:").strip()
        if not line.startswith("data:") or not data.startswith("{"):
            continue
        try:
            if "error" in json.loads(data):
                return data[:300]
        except json.JSONDecodeError:
            return data[:300]  # a torn event is as bad as an error
    return None


async def send_hostile(client: httpx.AsyncClient, url: str, model: str, kind: str) -> HostileResult:
    """Send one hostile request (adding the API key unless its headers carry their own) and
    read its whole response."""
    hostile = HOSTILE[kind]
    content, headers = hostile.make(model)
    if not any(name == "Authorization" for name, _ in headers):
        headers = [*headers, AUTH]
    try:
        response = await client.post(url + hostile.path, content=content, headers=headers)
    except httpx.TimeoutException:
        return HostileResult(kind, "hang", False)
    except httpx.TransportError as exc:
        return HostileResult(kind, "dropped", False, repr(exc))
    status, detail = str(response.status_code), response.text[:300]
    if status == "200":
        event = _error_event(response.text)
        status, detail = (status, "") if event is None else (status + " +error event", event)
    return HostileResult(kind, status, status in hostile.expect, detail)


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
    num_hostile = max(len(kinds), round(args.hostile_frac * len(requests)))
    hostile = [kinds[i % len(kinds)] for i in range(num_hostile)]
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
            f"{r.kind}: {r.status} {r.detail}" for r in hostile_results if not r.expected
        ],
        "hostile_details": {r.kind: r.detail for r in hostile_results if r.detail},
        "pool_after": pool,
        "pool_free": all(v == 0 for v in pool.values()),
        "health_after": health,
        "p50_ttft_ms": summary.ttft_ms.percentiles["p50"],
        "p99_ttft_ms": summary.ttft_ms.percentiles["p99"],
        "duration_s": duration,
        "server_log_tail": log_tail if server_errors or lost else "",
    }


def build_tiny_engine(root: Path) -> Path:
    """The tests' tiny Llama (2 layers, hidden 64), built for cpu under ``root`` (block size 16,
    a ``TINY_MAX_SEQ_LEN`` context)."""
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from tests.tiny_models import make_tiny_llama

    model = make_tiny_llama(root / "model", max_position_embeddings=TINY_MAX_SEQ_LEN)
    config = BuildConfig.of(
        model=str(model), block_size=16, max_seq_len=TINY_MAX_SEQ_LEN, output=str(root / "engine")
    )
    return Path(build(config).engine_dir)


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
    for kind in HOSTILE:
        if kind in run["hostile_statuses"]:
            print(f"  hostile {kind:34s} {run['hostile_statuses'][kind]}")
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
    broken = any(
        r["server_errors"] or r["lost"] or not r["pool_free"] or r["hostile_failures"]
        for r in runs.values()
    ) or any(r["health_after"] != 200 for r in runs.values())
    within = all(r is not None and r <= 2.0 for r in ratios.values())
    print(
        f"bar (0 5xx, 0 lost, pool free, hostile answered as expected, TTFT within 2x): "
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
