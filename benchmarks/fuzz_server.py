"""Fuzz a running ``llmc serve`` for minutes: the generators of ``tests/test_server_fuzz.py``
(schemathesis from the server's own ``/openapi.json``, and hypothesis strategies that reach the
engine), longer, counting outcomes instead of stopping at the first failure.

    python benchmarks/fuzz_server.py --minutes 10
    python benchmarks/fuzz_server.py --engine engines/gemma-3-270m-cpu-float32-none --minutes 30

Without ``--engine`` the script builds the tests' tiny Llama (2 layers, hidden 64) into a
temporary directory (about 30 s) and serves it with a 32-block KV pool. The server is the real
``llmc serve`` in a child process, with an API key and a 64 KiB body cap (``--serve-args`` adds
flags). Requests go one at a time on keep-alive connections. First schemathesis' coverage
phase (every field at and past its bounds, once), then rounds of schemathesis fuzzing
(positive and negative data on both generation endpoints) and engine requests until
``--minutes`` are spent.

A failure is a 5xx, a 4xx without OpenAI's error body, a stream with an in-band error event or
cut short, schema-violating data accepted, no answer in ``--hang-s`` seconds, or a dropped
connection (during a request or right after it). Printed: responses counted by generator,
endpoint and status; each kind of failure once with its count, the request (as curl) and the
response; then whether the server still serves, ``/health`` answers 200 and the KV pool is
free (``/metrics``). Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from prometheus_client.parser import text_string_to_metric_families
from schemathesis.core.failures import FailureGroup

# The generators live with the CI test; make the repository root importable when run as
# ``python benchmarks/fuzz_server.py``.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmc.bench.runner import first_model  # noqa: E402
from llmc.bench.server_process import ServeProcess  # noqa: E402
from tests.test_server_fuzz import (  # noqa: E402
    DROPPED_AFTER,
    SCHEMA_CHECKS,
    engine_requests,
    openapi_schema,
    post_and_check,
    response_problem,
)

API_KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TINY_SERVE_ARGS = "--kv-cache-memory 0.00025 --max-waiting 8"  # 32 blocks of the tiny Llama
CHUNK = 25  # examples of one generator before the next one gets a turn


@dataclass
class Tally:
    """Responses by (generator, endpoint, status); failures by kind, the first request kept."""

    counts: Counter = field(default_factory=Counter)
    failures: dict[str, list[Any]] = field(default_factory=dict)  # kind -> [count, request, why]

    def record(self, key: tuple[str, str, str], problem: str | None, request: str) -> None:
        self.counts[key] += 1
        for line in problem.splitlines()[:2] if problem else []:
            if line.startswith((" ", "Expected", "Invalid")):
                continue  # the rest of a schemathesis message
            if line.startswith(DROPPED_AFTER):
                line = line.split(":")[0]
            kind = f"{key[1]}: " + re.sub(r"[0-9a-f]{32}|\d+", "#", line)[:200]
            self.failures.setdefault(kind, [0, request, problem])[0] += 1


def _curl(path: str, body: dict[str, Any], base_url: str) -> str:
    return (
        f"curl -X POST -H 'Authorization: Bearer {API_KEY}' -H 'Content-Type: application/json' "
        f"-d {shlex.quote(json.dumps(body))} {base_url}{path}"
    )


def run_case(case: schemathesis.Case, session: requests.Session, hang_s: float) -> tuple:
    """Send one schemathesis case on ``session``: (status, problem or None) as
    ``post_and_check`` says them, plus schemathesis' own checks (``SCHEMA_CHECKS``)."""
    try:
        response = case.call(session=session, headers=AUTH, timeout=hang_s)
    except requests.Timeout:
        return "hang", "no answer: the server hangs"
    except requests.ConnectionError as exc:
        return "dropped", f"connection dropped without a response: {exc!r}"
    status = str(response.status_code)
    content_type = response.headers.get("content-type", [""])[0]  # schemathesis: name -> list
    problem = response_problem(response.status_code, content_type, response.text)
    try:
        case.validate_response(response, checks=SCHEMA_CHECKS)
    except FailureGroup as group:
        problem = problem or "\n".join(f"{f.title}: {f.message}" for f in group.exceptions)
    try:  # the same keep-alive connection must still answer
        session.get(case.operation.schema.get_base_url() + "/health", timeout=hang_s)
    except requests.ConnectionError as exc:
        dropped = f"{DROPPED_AFTER} {status} response: {exc!r}"
        problem = f"{problem}\n{dropped}" if problem else dropped
    return status, problem


def fuzz(strategy: Any, examples: int, seed_value: int, each: Callable[[Any], None]) -> None:
    """Call ``each`` on ``examples`` draws of ``strategy`` (no shrinking, nothing stored)."""

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(value: Any) -> None:
        each(value)

    run()


def run_fuzzing(url: str, model: str, args: argparse.Namespace, tally: Tally) -> None:
    """Schemathesis' coverage cases once, then rounds of ``CHUNK`` examples of every generator
    until ``args.minutes`` are spent."""
    deadline = time.monotonic() + 60 * args.minutes
    schema = openapi_schema(url, model, API_KEY)
    session = requests.Session()
    http = httpx.Client(base_url=url, timeout=args.hang_s, headers=AUTH)
    operations = [result.ok() for result in schema.get_all_operations()]
    modes = list(schemathesis.GenerationMode)

    def send_case(case: schemathesis.Case, generator: str) -> None:
        if time.monotonic() < deadline:
            status, problem = run_case(case, session, args.hang_s)
            request = case.as_curl_command(headers=AUTH)
            tally.record((generator, case.operation.label, status), problem, request)

    def send_engine(request: tuple[str, dict[str, Any]]) -> None:
        if time.monotonic() < deadline:
            path, body = request
            status, problem = post_and_check(http, path, body)
            tally.record(("engine", f"POST {path}", status), problem, _curl(path, body, url))

    for operation in operations:
        config = schema.config.generation_for(operation=operation)
        for case in schema.iter_coverage_cases(
            operation, generation_modes=modes, generation_config=config
        ):
            send_case(case, "coverage")
    generators = [(engine_requests(model), send_engine)]
    for operation in operations:
        if operation.method.upper() == "POST":
            for mode in modes:
                name = f"fuzz-{mode.value}"
                generators.append((operation.as_strategy(mode), lambda c, n=name: send_case(c, n)))
    round_index = 0
    while time.monotonic() < deadline:
        for strategy, each in generators:
            fuzz(strategy, CHUNK, args.seed + round_index, each)
        round_index += 1
    http.close()
    session.close()


def build_tiny_engine(root: Path) -> Path:
    """The tests' tiny Llama, built for cpu (block size 16, context 128) under ``root``."""
    from llmc.compiler.build import build
    from llmc.compiler.build_config import BuildConfig
    from tests.tiny_models import make_tiny_llama

    model = make_tiny_llama(root / "model")
    config = BuildConfig.of(
        model=str(model), block_size=16, max_seq_len=128, output=str(root / "engine")
    )
    return Path(build(config).engine_dir)


def check_unharmed(url: str, model: str) -> list[str]:
    """What is wrong with the server after the fuzzing: it must serve a normal completion,
    ``/health`` must be 200, and within 10 s no request may run or wait and no KV block be in
    use (``/metrics``)."""
    problems = []
    body = {"model": model, "prompt": "Hello there", "max_tokens": 4, "ignore_eos": True}
    try:
        ok = httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=60)
        if ok.status_code != 200 or ok.json()["usage"]["completion_tokens"] != 4:
            problems.append(f"a normal completion got {ok.status_code}: {ok.text[:300]}")
        if (health := httpx.get(url + "/health", timeout=10).status_code) != 200:
            problems.append(f"/health answers {health}")
    except httpx.HTTPError as exc:
        return [f"the server does not answer: {exc!r}"]
    names = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(url + "/metrics", timeout=10).text
        samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        values = {name: samples.get(name) for name in names}
        if all(v == 0 for v in values.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not all(v == 0 for v in values.values()):
        problems.append(f"the pool is not free 10 s after the fuzzing: {values}")
    return problems


def report(tally: Tally, unharmed: list[str], seconds: float) -> None:
    """Print the counts, each kind of failure once, and the state after the fuzzing."""
    print(f"\n{sum(tally.counts.values())} requests in {seconds:.0f} s")
    print(f"{'generator':16s} {'endpoint':28s} {'status':8s} {'count':>7s}")
    for (generator, endpoint, status), count in sorted(tally.counts.items()):
        print(f"{generator:16s} {endpoint:28s} {status:8s} {count:7d}")
    print(f"\n{len(tally.failures)} kinds of failure")
    for kind, (count, request, problem) in sorted(tally.failures.items(), key=lambda kv: -kv[1][0]):
        print(f"\n[{count}x] {kind}\n  request:  {request[:2000]}\n  response: {problem[:1000]}")
    after = "; ".join(unharmed) or "serves, /health 200, nothing running or waiting, KV usage 0"
    print(f"\nafter the fuzzing: {after}")


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", help="engine directory (default: build the tiny Llama)")
    parser.add_argument("--minutes", type=float, default=5.0, help="how long to fuzz")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    parser.add_argument("--hang-s", type=float, default=60.0, help="no answer this long: a hang")
    parser.add_argument(
        "--serve-args",
        default=None,
        help=f"extra llmc serve flags (default for the tiny engine: {TINY_SERVE_ARGS!r})",
    )
    args = parser.parse_args()
    args.seed = random.randrange(2**32) if args.seed is None else args.seed
    print(f"seed {args.seed}")
    if args.serve_args is None:
        args.serve_args = "" if args.engine else TINY_SERVE_ARGS
    serve_args = ["--api-key", API_KEY, "--max-request-body-bytes", "65536"]
    with tempfile.TemporaryDirectory() as tmp:
        engine = args.engine or build_tiny_engine(Path(tmp))
        with ServeProcess(engine, serve_args + shlex.split(args.serve_args)) as server:
            model = first_model(server.url, API_KEY)
            tally = Tally()
            start = time.monotonic()
            run_fuzzing(server.url, model, args, tally)
            seconds = time.monotonic() - start
            unharmed = check_unharmed(server.url, model)
            report(tally, unharmed, seconds)
            if tally.failures:
                print(f"\nserver log (tail):\n{server.log_tail(3000)}")
    sys.exit(1 if tally.failures or unharmed else 0)


if __name__ == "__main__":
    main()
