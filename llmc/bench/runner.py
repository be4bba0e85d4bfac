"""Drive a set of requests against a server: Poisson arrivals, bounded concurrency.

Arrival times follow vLLM's ``get_request`` with burstiness 1: gaps between sends are drawn from
an exponential distribution of mean ``1 / request_rate`` (a Poisson process); ``inf`` sends every
request at once. ``max_concurrency`` bounds requests in flight with a semaphore, like
``vllm bench serve --max-concurrency``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from llmc.bench.client import RequestResult, Target, send_request
from llmc.bench.config import BenchConfig
from llmc.bench.dataset import BenchRequest, make_requests
from llmc.bench.metrics import BenchResult, summarize
from llmc.bench.spec_metrics import SpecDecodeCounts, scrape_spec_decode
from llmc.errors import LlmcError


class BenchTargetError(LlmcError):
    """The server cannot be reached or does not answer ``GET /v1/models`` as OpenAI's API does."""


@dataclass(frozen=True)
class BenchRun:
    """A finished run: what was asked, of which model, and what came back.

    Attributes:
        config: the run's options.
        model: the model the requests named.
        result: the statistics.
        requests: per request, in send order.
        spec_decode: the server's speculative-decoding counts over the run, or None when it
            exports none (``/metrics``).
    """

    config: BenchConfig
    model: str
    result: BenchResult
    requests: list[RequestResult]
    spec_decode: SpecDecodeCounts | None = None


def arrival_offsets(num: int, request_rate: float, seed: int) -> list[float]:
    """Send times of ``num`` requests relative to the first, seconds: cumulative exponential gaps
    of mean ``1 / request_rate`` (the first at 0); all 0 when ``request_rate`` is inf."""
    if math.isinf(request_rate):
        return [0.0] * num
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for i in range(num):
        if i:
            t += rng.expovariate(request_rate)
        offsets.append(t)
    return offsets


async def run_requests(
    target: Target,
    requests: list[BenchRequest],
    *,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    seed: int = 0,
    timeout_s: float = 600.0,
) -> tuple[list[RequestResult], float]:
    """Send ``requests`` (see the module doc); returns their results in the same order and the
    run's wall-clock duration in seconds. Failed requests are results, not exceptions."""
    offsets = arrival_offsets(len(requests), request_rate, seed)
    limit = asyncio.Semaphore(max_concurrency or len(requests) or 1)
    connections = httpx.Limits(max_connections=max_concurrency or len(requests) or 1)
    async with httpx.AsyncClient(timeout=timeout_s, limits=connections) as client:
        start = time.perf_counter()

        async def one(request: BenchRequest, offset: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            async with limit:
                return await send_request(client, target, request)

        results = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets, strict=True)))
        duration = time.perf_counter() - start
    return list(results), duration


def first_model(base_url: str, api_key: str | None = None, timeout_s: float = 30.0) -> str:
    """The ``id`` of the first model of ``GET /v1/models``.

    Raises:
        BenchTargetError: if the server is unreachable, refuses (e.g. 401: wrong ``api_key``), or
            lists no model.
    """
    url = base_url.rstrip("/") + "/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise BenchTargetError(
            f"cannot reach {url}: {exc}; check --base-url and that the server is running"
        ) from exc
    if response.status_code != 200:
        raise BenchTargetError(
            f"GET {url} answered {response.status_code}: {response.text[:300]}; "
            + ("check --api-key" if response.status_code in (401, 403) else "check --base-url")
        )
    try:
        return str(response.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise BenchTargetError(
            f"GET {url} listed no model ({response.text[:300]}); pass --model"
        ) from exc


def run_bench(config: BenchConfig) -> BenchRun:
    """Run the benchmark ``config`` describes (blocking).

    Raises:
        BenchConfigError: for invalid options or an unreadable prompt file or tokenizer.
        BenchTargetError: when ``config.model`` is None and ``GET /v1/models`` fails.
    """
    config.validate()
    requests = make_requests(config)
    model = config.model or first_model(config.base_url, config.api_key)
    schema = json.loads(Path(config.json_schema).read_text()) if config.json_schema else None
    target = Target(
        base_url=config.base_url,
        model=model,
        endpoint=config.endpoint,
        api_key=config.api_key,
        ignore_eos=config.ignore_eos,
        temperature=config.temperature,
        json_schema=schema,
    )
    spec_before = scrape_spec_decode(config.base_url, config.api_key)
    results, duration = asyncio.run(
        run_requests(
            target,
            requests,
            request_rate=config.request_rate,
            max_concurrency=config.max_concurrency,
            seed=config.seed,
            timeout_s=config.timeout_s,
        )
    )
    spec_after = scrape_spec_decode(config.base_url, config.api_key)
    spec = spec_after - spec_before if spec_before and spec_after else None
    return BenchRun(config, model, summarize(results, duration), results, spec)
