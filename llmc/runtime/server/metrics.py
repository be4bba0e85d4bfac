"""Prometheus metrics of the server, under vLLM's metric names so existing dashboards work.

Each app owns its own ``CollectorRegistry`` (no process-global state), exposed at ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from llmc.runtime.server.async_engine import AsyncLLMEngine

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    """Request counters, token counters, TTFT and end-to-end latency histograms, queue gauges.

    Args:
        engine: read for the ``num_requests_running`` / ``num_requests_waiting`` gauges.
        model_name: the ``model_name`` label of every metric.
    """

    def __init__(self, engine: AsyncLLMEngine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        running = Gauge(
            "vllm:num_requests_running", "Requests generating.", labels, registry=self.registry
        )
        waiting = Gauge(
            "vllm:num_requests_waiting",
            "Requests waiting for their first token.",
            labels,
            registry=self.registry,
        )
        running.labels(model_name).set_function(lambda: engine.num_running)
        waiting.labels(model_name).set_function(lambda: engine.num_waiting)
        self._prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=self.registry
        ).labels(model_name)
        self._generation_tokens = Counter(
            "vllm:generation_tokens", "Tokens generated.", labels, registry=self.registry
        ).labels(model_name)
        self._success = Counter(
            "vllm:request_success",
            "Requests finished, by finish reason.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token (TTFT), seconds.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency, seconds.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)
        self._model_name = model_name

    def observe_first_token(self, ttft_s: float) -> None:
        """Record one request's time to first token."""
        self._ttft.observe(ttft_s)

    def observe_finished(
        self, prompt_tokens: int, completion_tokens: int, finish_reason: str, e2e_s: float
    ) -> None:
        """Record a request that ran to completion."""
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc(completion_tokens)
        self._success.labels(self._model_name, finish_reason).inc()
        self._e2e.observe(e2e_s)

    def render(self) -> bytes:
        """The metrics in Prometheus' text exposition format."""
        return generate_latest(self.registry)
