"""The FastAPI application: routes, API-key check, client-disconnect handling.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models`` (behind the
API key when one is set), ``GET /health`` and ``GET /metrics`` (public, for load balancers and
Prometheus).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from llmc.runtime.server.async_engine import AsyncLLMEngine
from llmc.runtime.server.errors import ApiError, install_error_handlers
from llmc.runtime.server.metrics import ServerMetrics
from llmc.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from llmc.runtime.server.responses import ModelCard, ModelList
from llmc.runtime.server.serving import OpenAIServing
from llmc.version import __version__


def build_app(
    engine: AsyncLLMEngine,
    model_name: str,
    api_key: str | None = None,
    retry_after_s: int = 1,
    owns_engine: bool = False,
) -> FastAPI:
    """Build the OpenAI-compatible app around a running engine.

    Args:
        engine: the running async engine; the caller shuts it down unless ``owns_engine``.
        model_name: the name clients pass as ``model``; any other name gets 404.
        api_key: when set, ``/v1/*`` requires ``Authorization: Bearer <api_key>`` (else 401).
        retry_after_s: ``Retry-After`` of the 503 sent when the waiting queue is full, seconds.
        owns_engine: stop the engine thread when the app shuts down (ASGI lifespan). uvicorn
            runs the lifespan shutdown after draining in-flight requests, and then, on SIGTERM,
            re-raises the signal, so code after ``uvicorn.run`` never runs.
    """
    metrics = ServerMetrics(engine, model_name)
    serving = OpenAIServing(engine, model_name, metrics, retry_after_s)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if owns_engine:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="llmc", version=__version__, lifespan=lifespan)
    install_error_handlers(app)
    router = APIRouter(prefix="/v1", dependencies=[Depends(_api_key_check(api_key))])

    @router.post("/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _until_disconnect(request, serving.completion(body))

    @router.post("/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _until_disconnect(request, serving.chat(body))

    @router.get("/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_name, max_model_len=engine.max_model_len)])

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.is_running else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    app.include_router(router)
    return app


def _api_key_check(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """A dependency that refuses requests without ``Authorization: Bearer <api_key>``."""

    async def check(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), api_key):
            raise ApiError(
                401,
                "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check


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
