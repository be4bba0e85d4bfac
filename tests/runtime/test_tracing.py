"""OpenTelemetry request spans from the real server on 127.0.0.1: a caller's ``traceparent``
makes the request's span its child, with the GenAI attributes (model, token counts, latencies);
a streamed request and a refused one are traced too; the OTLP/HTTP exporter delivers the span to
a collector listening on 127.0.0.1 (an in-test HTTP server decoding OTLP protobuf)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.runtime.test_server import MODEL

if TYPE_CHECKING:
    from tests.conftest import ServerFactory

pytest.importorskip("opentelemetry.sdk")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture(scope="module")
def traced(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[tuple]:
    """(server, in-memory exporter) of a server tracing to memory."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from llmc.runtime.engine import LLMEngine
    from llmc.runtime.server.tracing import RequestTracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    with running_server(engine, MODEL, tracing=RequestTracing(provider)) as server:
        yield server, exporter


def _spans(exporter, request_id: str):
    return [
        s for s in exporter.get_finished_spans() if s.attributes["gen_ai.response.id"] == request_id
    ]


def test_the_request_span_is_a_child_of_the_callers_traceparent(traced):
    server, exporter = traced
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 5, "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers={"traceparent": TRACEPARENT})
    assert r.status_code == 200, r.text
    (span,) = _spans(exporter, r.json()["id"])
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_ID
    assert span.name == f"text_completion {MODEL}"
    a = span.attributes
    usage = r.json()["usage"]
    assert a["gen_ai.request.model"] == MODEL and a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 5
    assert a["gen_ai.request.max_tokens"] == 5
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("length",)
    assert 0 <= a["gen_ai.latency.time_in_queue"] <= a["gen_ai.latency.time_to_first_token"]
    assert a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"]


def test_a_streamed_chat_is_traced_and_a_request_without_a_parent_starts_a_trace(traced):
    server, exporter = traced
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}
    ) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    request_id = lines[0].split('"id":"')[1].split('"')[0]
    (span,) = _spans(exporter, request_id)
    assert span.parent is None and span.name == f"chat {MODEL}"
    assert span.attributes["gen_ai.usage.output_tokens"] == 3


def test_a_refused_request_ends_its_span_as_an_error(traced):
    server, exporter = traced
    before = len(exporter.get_finished_spans())
    body = {"model": MODEL, "prompt": [5] * 5000, "max_tokens": 1}  # past max_model_len
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers={"traceparent": TRACEPARENT})
    assert r.status_code == 400, r.text
    new = exporter.get_finished_spans()[before:]
    assert len(new) == 1 and new[0].status.status_code.name == "ERROR"
    assert new[0].attributes["error.type"] == "400"


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP traces endpoint: decodes each export request's protobuf body."""

    received: list = []

    def do_POST(self) -> None:  # noqa: N802 (the handler's API)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.received.append((self.path, request))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_the_otlp_exporter_delivers_the_span_to_a_collector(tiny_llama_engine, running_server):
    from llmc.runtime.engine import LLMEngine
    from llmc.runtime.server.tracing import RequestTracing

    collector = http.server.HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{collector.server_port}/v1/traces"
    tracing = RequestTracing.otlp(endpoint, service_name="llmc-test")
    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
    try:
        with running_server(engine, MODEL, tracing=tracing) as server:
            headers = {"traceparent": TRACEPARENT}
            r = httpx.post(f"{server.url}/v1/completions", json=body, headers=headers)
            assert r.status_code == 200
        tracing.provider.force_flush()  # the app's shutdown flushed it already
    finally:
        collector.shutdown()
    spans = [
        (path, span)
        for path, req in _Collector.received
        for resource in req.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    ours = [s for _, s in spans if s.name == f"text_completion {MODEL}"]
    assert len(ours) == 1 and spans[0][0] == "/v1/traces"
    assert ours[0].trace_id.hex() == TRACE_ID and ours[0].parent_span_id.hex() == PARENT_ID
    attributes = {kv.key: kv.value for kv in ours[0].attributes}
    assert attributes["gen_ai.usage.output_tokens"].int_value == 2
    assert attributes["gen_ai.request.model"].string_value == MODEL


def test_no_opentelemetry_sdk_or_exporter_is_imported_without_tracing():
    """(FastAPI imports OpenTelemetry's API itself; the SDK and the exporter are ours.)"""
    import subprocess
    import sys

    code = (
        "import sys; import llmc.runtime.server.api_server, llmc.runtime.server.app; "
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', "
        "'opentelemetry.exporter'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
