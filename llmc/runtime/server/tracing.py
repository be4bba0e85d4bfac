"""OpenTelemetry tracing of requests: one span per completion or chat request.

``llmc serve --otlp-traces-endpoint URL`` (vLLM's flag) exports spans over OTLP/HTTP to a
collector (Jaeger, Tempo, the OpenTelemetry Collector); without it OpenTelemetry's SDK and
exporter are never imported (FastAPI imports its API itself). A caller's W3C ``traceparent``
(and ``tracestate``) header makes the request's span its child, so a trace runs from the client
through llmc. The span is named ``"{operation} {model}"`` with the GenAI semantic conventions'
attributes (``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.response.id``,
``gen_ai.request.max_tokens`` / ``temperature`` / ``top_p``, ``gen_ai.usage.input_tokens`` /
``output_tokens``, ``gen_ai.response.finish_reasons``) and vLLM's latency attributes
(``gen_ai.latency.time_in_queue``, ``gen_ai.latency.time_to_first_token``,
``gen_ai.latency.e2e``, seconds). Each app owns its tracer provider (no global state);
``shutdown`` flushes it. Needs ``pip install "llmc[otel]"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The GenAI operation of each route.
OPERATIONS = {"completion": "text_completion", "chat": "chat"}
PROVIDER = "llmc"


class RequestTracing:
    """Opens request spans on ``provider`` (an ``opentelemetry.sdk.trace.TracerProvider``)."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("llmc")
        self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def otlp(cls, endpoint: str, service_name: str = "llmc") -> RequestTracing:
        """Spans batched to the OTLP/HTTP collector at ``endpoint`` (its traces URL, e.g.
        ``http://collector:4318/v1/traces``). Raises ImportError naming the extra when
        OpenTelemetry's SDK or exporter is not installed."""
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise ImportError(
                f'--otlp-traces-endpoint needs OpenTelemetry: pip install "llmc[otel]" ({exc})'
            ) from exc
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        return cls(provider)

    def start(self, headers: Mapping[str, str], route: str, model: str, request_id: str, params):
        """The span of one request (a ``RequestSpan``), a child of the context in ``headers``
        (``traceparent``), started now. ``params``: its ``SamplingParams``."""
        from opentelemetry.trace import SpanKind

        carrier = {k.lower(): v for k, v in headers.items()}
        context = self._propagator.extract(carrier)
        operation = OPERATIONS[route]
        span = self.tracer.start_span(
            f"{operation} {model}",
            context=context,
            kind=SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": PROVIDER,
                "gen_ai.request.model": model,
                "gen_ai.response.id": request_id,
                "gen_ai.request.max_tokens": params.max_tokens,
                "gen_ai.request.temperature": params.temperature,
                "gen_ai.request.top_p": params.top_p,
                "gen_ai.request.choice.count": params.n,
            },
        )
        return RequestSpan(span)

    def shutdown(self) -> None:
        """Export what is buffered and stop."""
        self.provider.shutdown()


class RequestSpan:
    """One request's span: ``finish`` sets its usage and latencies and ends it (once)."""

    def __init__(self, span: Any) -> None:
        self.span = span
        self._ended = False

    def finish(self, output, num_prompt_tokens: int, num_tokens: int, ttft_s, e2e_s) -> None:
        """End the span with the request's last ``output`` (a ``RequestOutput`` or None),
        token counts and latencies (seconds; ``ttft_s`` None when no token came)."""
        if self._ended:
            return
        self._ended = True
        attributes = {
            "gen_ai.usage.input_tokens": num_prompt_tokens,
            "gen_ai.usage.output_tokens": num_tokens,
            "gen_ai.latency.e2e": e2e_s,
        }
        if ttft_s is not None:
            attributes["gen_ai.latency.time_to_first_token"] = ttft_s
        if output is not None:
            reasons = [o.finish_reason or "none" for o in output.outputs]
            attributes["gen_ai.response.finish_reasons"] = reasons
            if output.time_in_queue is not None:
                attributes["gen_ai.latency.time_in_queue"] = output.time_in_queue
        self.span.set_attributes(attributes)
        self.span.end()

    def fail(self, exc: BaseException) -> None:
        """End the span as failed by ``exc`` (an API error's status, or the exception's type),
        unless it has ended."""
        if self._ended:
            return
        from opentelemetry.trace import Status, StatusCode

        self._ended = True
        status = getattr(exc, "status", None)  # an ApiError's HTTP status
        self.span.set_attribute("error.type", str(status or type(exc).__name__))
        self.span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
        self.span.end()
