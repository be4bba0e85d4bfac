"""Fuzz two running ``llmc serve`` for a while: the generators of
``tests/runtime/test_server_fuzz.py``
(schemathesis from the server's own ``/openapi.json``; hypothesis strategies that reach the
engine; constrained requests: structured outputs and tools, generated and hostile), longer,
counting outcomes instead of stopping at the first failure.

    python benchmarks/fuzz_server.py --duration 600
    python benchmarks/fuzz_server.py --engine engines/gemma-3-270m-cpu-float32-none --duration 1800

Without ``--engine`` the script builds the tests' tiny Llama (2 layers, hidden 64) with a
1,024-token context into a temporary directory (about 30 s). Two servers, each the real ``llmc
serve`` in a child process with an API key, as the test's two: one for schemathesis and the
engine requests (``--max-model-len 128``, a 32-block KV pool, a 64 KiB body cap), one for the
constrained requests (the whole context, 96 blocks, a 2 MiB body cap, the default constraint
bounds); ``--serve-args`` and ``--constrained-serve-args`` replace the tiny engine's flags.
Requests go one at a time on keep-alive connections. First schemathesis' coverage phase (every
field at and past its bounds, once), then rounds of ``CHUNK`` examples of every generator until
``--duration`` seconds are spent.

A failure is a 5xx, a 4xx without OpenAI's error body, a stream cut short or with an in-band
error event other than the request's failed constraint, schema-violating data accepted, a
constrained output that breaks its constraint, no answer in ``--hang-s`` seconds, or a dropped
connection (during a request or right after it). Printed: the request count; responses counted
by status, and by generator, endpoint and status; each kind of failure once with its count, the
request (as curl) and the response; then whether each server still serves, ``/health``
answers 200 and the KV pool is free (``/metrics``). Exit status 1 when anything failed.
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
from tests.runtime.test_server_fuzz import (  # noqa: E402
    CONSTRAINED_MAX_BODY,
    CONSTRAINED_MAX_SEQ_LEN,
    DROPPED_AFTER,
    MAX_BODY,
    SCHEMA_CHECKS,
    build_engine,
    constrained_requests,
    engine_requests,
    openapi_schema,
    post_and_check,
    response_problem,
    tool_requests,
)

API_KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# The tiny Llama's flags for the two servers, as the test's: 32 and 96 KV blocks.
TINY_SERVE_ARGS = "--max-model-len 128 --kv-cache-memory 0.00025 --max-waiting 8"
TINY_CONSTRAINED_SERVE_ARGS = "--kv-cache-memory 0.00075 --max-waiting 8"
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


@dataclass(frozen=True)
class Servers:
    """The two servers' base URLs and the model name each serves."""

    url: str
    model: str
    constrained_url: str
    constrained_model: str


def run_fuzzing(servers: Servers, args: argparse.Namespace, tally: Tally) -> None:
    """Schemathesis' coverage cases once, then rounds of ``CHUNK`` examples of every generator
    until ``args.duration`` seconds are spent."""
    deadline = time.monotonic() + args.duration
    url, model, cmodel = servers.url, servers.model, servers.constrained_model
    schema = openapi_schema(url, model, API_KEY)
    session = requests.Session()
    http = httpx.Client(base_url=url, timeout=args.hang_s, headers=AUTH)
    chttp = httpx.Client(base_url=servers.constrained_url, timeout=args.hang_s, headers=AUTH)
    operations = [result.ok() for result in schema.get_all_operations()]
    modes = list(schemathesis.GenerationMode)

    def send_case(case: schemathesis.Case, generator: str) -> None:
        if time.monotonic() < deadline:
            status, problem = run_case(case, session, args.hang_s)
            request = case.as_curl_command(headers=AUTH)
            tally.record((generator, case.operation.label, status), problem, request)

    def sender(generator: str, client: httpx.Client) -> Callable[[Any], None]:
        def send(request: tuple[str, dict[str, Any]]) -> None:
            if time.monotonic() < deadline:
                path, body = request
                status, problem = post_and_check(client, path, body)
                curl = _curl(path, body, str(client.base_url).rstrip("/"))
                tally.record((generator, f"POST {path}", status), problem, curl)

        return send

    for operation in operations:
        config = schema.config.generation_for(operation=operation)
        for case in schema.iter_coverage_cases(
            operation, generation_modes=modes, generation_config=config
        ):
            send_case(case, "coverage")
    generators = [
        (engine_requests(model), sender("engine", http)),
        (constrained_requests(cmodel), sender("constrained", chttp)),
        (constrained_requests(cmodel, hostile=True), sender("constrained-hostile", chttp)),
        (tool_requests(cmodel), sender("tools", chttp)),
        (tool_requests(cmodel, hostile=True), sender("tools-hostile", chttp)),
    ]
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
    chttp.close()
    session.close()


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
    by_status: Counter = Counter()
    for (_, _, status), count in tally.counts.items():
        by_status[status] += count
    print("by status: " + ", ".join(f"{s} {n}" for s, n in sorted(by_status.items())))
    print(f"{'generator':20s} {'endpoint':28s} {'status':8s} {'count':>7s}")
    for (generator, endpoint, status), count in sorted(tally.counts.items()):
        print(f"{generator:20s} {endpoint:28s} {status:8s} {count:7d}")
    print(f"\n{len(tally.failures)} kinds of failure")
    for kind, (count, request, problem) in sorted(tally.failures.items(), key=lambda kv: -kv[1][0]):
        print(f"\n[{count}x] {kind}\n  request:  {request[:2000]}\n  response: {problem[:1000]}")
    after = (
        "; ".join(unharmed) or "each serves, /health 200, nothing running or waiting, KV usage 0"
    )
    print(f"\nafter the fuzzing: {after}")


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", help="engine directory (default: build the tiny Llama)")
    parser.add_argument("--duration", type=float, default=300.0, help="how long to fuzz, seconds")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    parser.add_argument("--hang-s", type=float, default=60.0, help="no answer this long: a hang")
    parser.add_argument(
        "--serve-args",
        default=None,
        help=f"extra llmc serve flags of the first server (default for the tiny engine: "
        f"{TINY_SERVE_ARGS!r})",
    )
    parser.add_argument(
        "--constrained-serve-args",
        default=None,
        help="extra llmc serve flags of the constrained requests' server (default for the tiny "
        f"engine: {TINY_CONSTRAINED_SERVE_ARGS!r})",
    )
    args = parser.parse_args()
    args.seed = random.randrange(2**32) if args.seed is None else args.seed
    print(f"seed {args.seed}")
    tiny = args.engine is None
    if args.serve_args is None:
        args.serve_args = TINY_SERVE_ARGS if tiny else ""
    if args.constrained_serve_args is None:
        args.constrained_serve_args = TINY_CONSTRAINED_SERVE_ARGS if tiny else ""
    plain_args = ["--api-key", API_KEY, "--max-request-body-bytes", str(MAX_BODY)]
    constrained_args = ["--api-key", API_KEY, "--max-request-body-bytes", str(CONSTRAINED_MAX_BODY)]
    with tempfile.TemporaryDirectory() as tmp:
        engine = args.engine or build_engine(Path(tmp), CONSTRAINED_MAX_SEQ_LEN)
        with (
            ServeProcess(engine, plain_args + shlex.split(args.serve_args)) as server,
            ServeProcess(
                engine, constrained_args + shlex.split(args.constrained_serve_args)
            ) as constrained,
        ):
            servers = Servers(
                server.url,
                first_model(server.url, API_KEY),
                constrained.url,
                first_model(constrained.url, API_KEY),
            )
            tally = Tally()
            start = time.monotonic()
            run_fuzzing(servers, args, tally)
            seconds = time.monotonic() - start
            unharmed = check_unharmed(servers.url, servers.model)
            unharmed += check_unharmed(servers.constrained_url, servers.constrained_model)
            report(tally, unharmed, seconds)
            if tally.failures:
                print(f"\nserver log (tail):\n{server.log_tail(3000)}")
                print(f"\nconstrained server log (tail):\n{constrained.log_tail(3000)}")
    sys.exit(1 if tally.failures or unharmed else 0)


if __name__ == "__main__":
    main()
