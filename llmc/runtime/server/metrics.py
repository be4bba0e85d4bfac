"""Prometheus metrics of the server, under vLLM's metric names so existing dashboards work.

Names and types follow vLLM v1's metrics (https://docs.vllm.ai/en/v0.12.0/design/metrics/,
``vllm/v1/metrics/loggers.py``): gauges ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (a fraction, 0..1); counters
``vllm:prefix_cache_queries``, ``vllm:prefix_cache_hits`` (in tokens), ``vllm:num_preemptions``,
``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_draft_tokens``,
``vllm:spec_decode_num_accepted_tokens``, ``vllm:prompt_tokens``, ``vllm:generation_tokens``,
``vllm:request_success`` (Prometheus adds ``_total`` to counters), ``vllm:lora_requests_info``
(a LoRA engine's adapters running and waiting); histograms
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:e2e_request_latency_seconds``.

Engine-side values (queues, KV pool, prefix cache, preemptions) are read at scrape time from the
engine's latest ``EngineStats`` snapshot; request-side values (tokens, latencies) are recorded by
the serving code. ``vllm:request_success`` counts every request the engine accepted once, when
it ends, by ``finished_reason``: "stop", "length", "abort" (client gone before or after its
first token, drain deadline) or "error" (its step failed, or the engine stopped); it is read
from ``AsyncLLMEngine.num_finished``, which sees every end, including those before a first
token that the serving code never tracks. Each app owns its own ``CollectorRegistry`` (no
process-global state).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmc.runtime.server.engine_client import EngineClient

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# vLLM's inter-token latency buckets, seconds.
_ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class _EngineCollector(Collector):
    """Reads the engine's latest ``EngineStats`` (and the server's queue) at scrape time."""

    def __init__(self, engine: EngineClient, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats
        labels = ["model_name"]
        gauges = [
            (
                "vllm:num_requests_running",
                "Requests in the engine's running set (prefill or decode).",
                stats.num_running,
            ),
            (
                "vllm:num_requests_waiting",
                "Requests waiting for admission (new or preempted).",
                stats.num_waiting,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "Fraction of KV-cache blocks in use (0..1); evictable cached blocks are free.",
                stats.kv_cache_usage,
            ),
        ]
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric([self.model_name], float(value))
            yield gauge
        counters = [
            (
                "vllm:prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache.",
                stats.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prompt tokens found in the prefix cache.",
                stats.prefix_cache_hits,
            ),
            (
                "vllm:num_preemptions",
                "Sequences preempted (to be recomputed).",
                stats.num_preemptions,
            ),
            (
                "vllm:spec_decode_num_drafts",
                "Speculative decoding: verifications of drafts (one per sequence and step).",
                stats.spec_decode_num_drafts,
            ),
            (
                "vllm:spec_decode_num_draft_tokens",
                "Speculative decoding: tokens drafted and verified.",
                stats.spec_decode_num_draft_tokens,
            ),
            (
                "vllm:spec_decode_num_accepted_tokens",
                "Speculative decoding: drafted tokens accepted (acceptance rate: accepted / draft "
                "tokens).",
                stats.spec_decode_num_accepted_tokens,
            ),
        ]
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric([self.model_name], float(value))
            yield counter
        finished = CounterMetricFamily(
            "vllm:request_success",
            "Requests ended, by finished_reason (stop, length, abort, error).",
            labels=[*labels, "finished_reason"],
        )
        for reason, count in self.engine.num_finished.items():
            finished.add_metric([self.model_name, reason], float(count))
        yield finished
        if stats.max_lora:
            yield _lora_info(stats)


def _lora_info(stats) -> GaugeMetricFamily:
    """vLLM's ``vllm:lora_requests_info``: the adapters running and waiting (comma-separated
    label values) and the slots, valued with the scrape's Unix time, as vLLM sets it."""
    gauge = GaugeMetricFamily(
        "vllm:lora_requests_info",
        "LoRA adapters of the running and waiting requests, and the engine's adapter slots.",
        labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
    )
    waiting, running = ",".join(stats.waiting_lora_adapters), ",".join(stats.running_lora_adapters)
    gauge.add_metric([str(stats.max_lora), waiting, running], time.time())
    return gauge


class ServerMetrics:
    """Engine gauges and counters, token counters, TTFT, inter-token and end-to-end latency.

    Args:
        engine: read at scrape time for the engine-side metrics.
        model_name: the ``model_name`` label of every metric.
    """

    def __init__(self, engine: EngineClient, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model_name))
        labels = ["model_name"]
        self._prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=self.registry
        ).labels(model_name)
        self._generation_tokens = Counter(
            "vllm:generation_tokens", "Tokens generated.", labels, registry=self.registry
        ).labels(model_name)
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token (TTFT), seconds.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)
        self._itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens of a request, seconds.",
            labels,
            buckets=_ITL_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency, seconds.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)

    def observe_first_token(self, ttft_s: float) -> None:
        """Record one request's time to first token."""
        self._ttft.observe(ttft_s)

    def observe_tokens(self, num_tokens: int, interval_s: float) -> None:
        """Record ``num_tokens`` new output tokens that arrived ``interval_s`` after the
        previous ones: each counts as one inter-token latency of ``interval_s / num_tokens``."""
        for _ in range(num_tokens):
            self._itl.observe(interval_s / num_tokens)

    def observe_finished(self, prompt_tokens: int, completion_tokens: int, e2e_s: float) -> None:
        """Record the tokens and latency of a request that ended (finished, aborted or
        disconnected) after its first output; its outcome is counted by the engine."""
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc(completion_tokens)
        self._e2e.observe(e2e_s)

    def render(self) -> bytes:
        """The metrics in Prometheus' text exposition format."""
        return generate_latest(self.registry)
