"""Benchmark statistics from per-request results, with vLLM's definitions.

As in vLLM's ``calculate_metrics`` (``vllm/benchmarks/serve.py``): over the successful requests,
TTFT and end-to-end latency per request; TPOT per request with more than one output token =
(latency - TTFT) / (output tokens - 1); ITL = every gap between content events, pooled over
requests; throughputs divide by the wall-clock duration of the whole run (first send to last
response). Percentiles interpolate linearly (``numpy.percentile``'s default, as vLLM). Requests the
client disconnected on purpose count in neither the successes nor the failures.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from llmc.bench.client import RequestResult

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class LatencyStats:
    """Mean, median, standard deviation and percentiles of one latency, milliseconds.

    Attributes:
        percentiles: {"p50": ..., "p95": ..., "p99": ...}.
        count: how many samples; 0 makes every statistic 0.
    """

    mean: float
    median: float
    std: float
    percentiles: dict[str, float]
    count: int

    @classmethod
    def of(cls, seconds: list[float]) -> LatencyStats:
        ms = np.asarray(seconds or [0.0], dtype=np.float64) * 1000.0
        return cls(
            mean=float(ms.mean()),
            median=float(np.median(ms)),
            std=float(ms.std()),
            percentiles={f"p{p}": float(np.percentile(ms, p)) for p in PERCENTILES},
            count=len(seconds),
        )


@dataclass(frozen=True)
class BenchResult:
    """The outcome of one run.

    Attributes:
        completed: successful requests. failed: requests that failed (kinds in ``errors``).
        disconnected: requests the client closed on purpose.
        errors: {kind: count}, kinds as `RequestResult.error`.
        duration_s: wall-clock time of the run, seconds.
        total_input_tokens, total_output_tokens: over the successful requests (usage counts).
        request_throughput: completed requests per second.
        output_throughput: output tokens per second; total_token_throughput: input + output.
        ttft_ms, tpot_ms, itl_ms, e2el_ms: latency statistics (see the module doc).
        max_concurrency_seen: most successful requests in flight at once.
    """

    completed: int
    failed: int
    disconnected: int
    errors: dict[str, int]
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    itl_ms: LatencyStats
    e2el_ms: LatencyStats
    max_concurrency_seen: int

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(results: list[RequestResult], duration_s: float) -> BenchResult:
    """Statistics of a run whose requests gave ``results`` in ``duration_s`` seconds.

    Raises:
        ValueError: if ``duration_s`` <= 0.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    ok = [r for r in results if r.success]
    failed = [r for r in results if not r.success and not r.disconnected]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2els = [r.latency for r in ok if r.latency is not None]
    tpots = [
        (r.latency - r.ttft) / (r.output_tokens - 1)
        for r in ok
        if r.output_tokens > 1 and r.latency is not None and r.ttft is not None
    ]
    itls = [gap for r in ok for gap in r.itl]
    total_in = sum(r.prompt_tokens or 0 for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    return BenchResult(
        completed=len(ok),
        failed=len(failed),
        disconnected=sum(r.disconnected for r in results),
        errors=dict(Counter(str(r.error) for r in failed)),
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(ok) / duration_s,
        output_throughput=total_out / duration_s,
        total_token_throughput=(total_in + total_out) / duration_s,
        ttft_ms=LatencyStats.of(ttfts),
        tpot_ms=LatencyStats.of(tpots),
        itl_ms=LatencyStats.of(itls),
        e2el_ms=LatencyStats.of(e2els),
        max_concurrency_seen=_peak_concurrency(ok),
    )


def _peak_concurrency(results: list[RequestResult]) -> int:
    """Most requests in flight at once, over half-open intervals [start, start + latency)."""
    events = sorted(
        [(r.start, 1) for r in results if r.latency is not None]
        + [(r.start + r.latency, -1) for r in results if r.latency is not None]
    )  # at equal times -1 sorts first: an ending request frees its place before one starts
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak
