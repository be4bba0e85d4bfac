"""The FastAPI application: routes, middleware, client-disconnect handling.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models`` (the model and
its LoRA adapters), and vLLM's ``POST /tokenize``, ``POST /detokenize`` and, when allowed, LoRA
``load``/``unload`` (``lora_routes.py``) (behind the API key when one is set, like every
route but the public three); ``GET /health`` (liveness: the
engine thread is alive), ``GET /ready`` (readiness: alive and not draining) and
``GET /metrics`` (Prometheus) are public, for load balancers and scrapers. ``HEAD`` works
wherever ``GET`` does.

Middleware, outermost first: ``FramingGuard`` (a request whose body framing is ambiguous, such as
``Content-Length`` with ``Transfer-Encoding``, gets a 400 and its connection closed; see
``framing.py``), CORS (only with ``allowed_origins``), then ``RequestGate`` (HEAD, API key, drain,
body size cap, UTF-8; see ``gate.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from llmc.runtime.server.drain import ABORT_GRACE_S, Drain
from llmc.runtime.server.engine_client import EngineClient
from llmc.runtime.server.errors import install_error_handlers
from llmc.runtime.server.framing import FramingGuard
from llmc.runtime.server.gate import RequestGate
from llmc.runtime.server.kserve_v2 import add_v2_routes
from llmc.runtime.server.limits import RequestLimits
from llmc.runtime.server.lora_routes import adapter_cards, add_lora_routes
from llmc.runtime.server.metrics import ServerMetrics
from llmc.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from llmc.runtime.server.responses import ModelCard, ModelList
from llmc.runtime.server.serving import OpenAIServing
from llmc.runtime.server.tokenize_protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from llmc.runtime.server.tracing import RequestTracing
from llmc.version import __version__


def build_app(
    engine: EngineClient,
    model_name: str,
    api_key: str | None = None,
    retry_after_s: int = 1,
    owns_engine: bool = False,
    allowed_origins: list[str] | None = None,
    limits: RequestLimits | None = None,
    tracing: RequestTracing | None = None,
    grpc_address: str | None = None,
    allow_runtime_lora_updating: bool = False,
) -> FastAPI:
    """Build the OpenAI-compatible app around a running engine.

    Args:
        engine: the running async engine; the caller shuts it down unless ``owns_engine``.
        model_name: the name clients pass as ``model``; any other name gets 404.
        api_key: when set, every route but ``/health``, ``/ready`` and ``/metrics`` requires
            ``Authorization: Bearer <api_key>`` (else 401).
        retry_after_s: ``Retry-After`` of the 503 sent when the waiting queue is full or the
            server drains, seconds.
        owns_engine: stop the engine thread when the app shuts down (ASGI lifespan). uvicorn
            runs the lifespan shutdown after draining in-flight requests, and then, on SIGTERM,
            re-raises the signal, so code after ``uvicorn.run`` never runs.
        allowed_origins: origins allowed by CORS (``["*"]`` for any); None or empty: no CORS
            headers at all, so browsers on other origins cannot call the API.
        limits: the bounds on one request (body size, n, stop strings, ...); None: the
            defaults of `RequestLimits`.
        tracing: where request spans go (``tracing.RequestTracing``); None: no tracing. The
            app shuts it down (flushing its spans) with itself.
        grpc_address: ``host:port`` to serve KServe v2 over gRPC on as well
            (``grpc_service.py``; needs ``tritonclient[grpc]``), started and stopped with the
            app (its bound port in ``app.state.grpc_port``); None: no gRPC.
        allow_runtime_lora_updating: serve ``/v1/load_lora_adapter`` and
            ``/v1/unload_lora_adapter`` (``lora_routes.py``); False: those routes are 404.

    Returns:
        The app; ``app.state.drain`` is its `Drain` (set ``draining`` to start a drain),
        ``app.state.metrics`` its `ServerMetrics` (a caller may register more collectors).
    """
    limits = limits or RequestLimits()
    metrics = ServerMetrics(engine, model_name)
    serving = OpenAIServing(engine, model_name, metrics, limits, retry_after_s, tracing)
    drain = Drain()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        grpc_server = None
        if grpc_address is not None:
            from llmc.runtime.server.grpc_service import InferenceServicer, start_grpc_server

            servicer = InferenceServicer(serving, model_name, engine, drain, api_key)
            grpc_server, app.state.grpc_port = await start_grpc_server(
                grpc_address, servicer, limits.max_request_body_bytes
            )
        yield
        if grpc_server is not None:
            await grpc_server.stop(grace=ABORT_GRACE_S)
        serving.close()
        if tracing is not None:
            await asyncio.to_thread(tracing.shutdown)
        if owns_engine:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="llmc", version=__version__, lifespan=lifespan)
    app.state.drain = drain
    app.state.metrics = metrics
    install_error_handlers(app)

    _add_routes(app, engine, model_name, serving, metrics, drain)
    add_v2_routes(app, serving, model_name, engine, drain, _until_disconnect)
    if allow_runtime_lora_updating:
        add_lora_routes(app, engine, model_name)
    _add_middleware(app, drain, api_key, limits, retry_after_s, allowed_origins)
    return app


def _add_routes(
    app: FastAPI,
    engine: EngineClient,
    model_name: str,
    serving: OpenAIServing,
    metrics: ServerMetrics,
    drain: Drain,
) -> None:
    """Add the OpenAI, tokenizer, health, readiness and metrics routes to ``app``."""

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _until_disconnect(request, serving.completion(body, request.headers))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _until_disconnect(request, serving.chat(body, request.headers))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        return await serving.tokenize(body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return await serving.detokenize(body)

    @app.get("/v1/models")
    async def models() -> ModelList:
        base = ModelCard(id=model_name, max_model_len=engine.max_model_len)
        return ModelList(data=[base, *adapter_cards(engine, model_name)])

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.is_running else 503)

    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if engine.is_running and not drain.draining else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")


def _add_middleware(
    app: FastAPI,
    drain: Drain,
    api_key: str | None,
    limits: RequestLimits,
    retry_after_s: int,
    allowed_origins: list[str] | None,
) -> None:
    """Add the middleware to ``app``, innermost first: the request gate, CORS, framing guard."""
    app.add_middleware(
        RequestGate,
        drain=drain,
        api_key=api_key,
        max_body_bytes=limits.max_request_body_bytes,
        retry_after_s=retry_after_s,
    )
    if allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=allowed_origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )
    app.add_middleware(FramingGuard)  # added last: outermost, before anything reads the request


async def _until_disconnect(request: Request, handler: Awaitable[Response]) -> Response:
    """Run ``handler`` until it returns or the client disconnects, whichever comes first.

    A request waiting for its first token (or a whole non-streamed completion) holds KV blocks;
    when its client goes away the handler is cancelled, which aborts the request in the engine.
    Once a streamed response has started, Starlette's ``StreamingResponse`` does the same.
    (vLLM's ``with_cancellation``.)
    """
    work = asyncio.ensure_future(handler)
    watch = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    if work.cancelled():
        return JSONResponse({}, status_code=499)  # nginx's "client closed request"; nobody reads it
    return work.result()


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
