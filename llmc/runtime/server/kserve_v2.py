"""The KServe v2 (Open Inference Protocol) REST routes, with Triton's generate extension.

Clients and gateways written for Triton Inference Server or KServe reach the same engine as the
OpenAI routes:

- ``GET /v2`` (server metadata), ``/v2/health/live``, ``/v2/health/ready``;
- ``GET /v2/models/{model}`` (model metadata: ``text_input`` BYTES in, ``text_output`` BYTES
  out, Triton's generate tensor names) and ``/v2/models/{model}/ready``;
- ``POST /v2/models/{model}/generate`` and ``/generate_stream`` (Triton's generate extension:
  ``{"text_input": ..., "parameters": {"max_tokens", "temperature", "top_p", "top_k", "seed",
  "stop", ...}}``, parameters also accepted at the top level) answering ``{"model_name",
  "model_version", "text_output"}``, streamed as server-sent events of text deltas.

A generate request is served as the ``/v1/completions`` request it spells (the same validation,
limits, sampling and metrics), so its tokens are those of ``/v1/completions``. Errors use the
protocol's body, ``{"error": message}``, with the OpenAI route's status.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from llmc.runtime.server.errors import ApiError
from llmc.runtime.server.protocol import CompletionRequest
from llmc.version import __version__

MODEL_VERSION = "1"
#: Triton's generate extension: parameters that are not sampling options.
_NOT_SAMPLING = {"stream"}


def add_v2_routes(app: FastAPI, serving, model_name: str, engine, drain, until_disconnect) -> None:
    """Add the v2 routes to ``app`` for ``serving`` (the ``OpenAIServing`` of ``model_name``),
    live while ``engine`` runs and ready while it is not draining (``drain``);
    ``until_disconnect(request, handler)`` runs a generate request until its client leaves (as
    the OpenAI routes do: the engine aborts it)."""

    def known(model: str) -> JSONResponse | None:
        if model == model_name:
            return None
        return _error(404, f"unknown model {model!r}; this server serves {model_name!r}")

    @app.get("/v2")
    async def server_metadata() -> dict:
        return {"name": "llmc", "version": __version__, "extensions": ["generate"]}

    @app.get("/v2/health/live")
    async def live() -> JSONResponse:
        return JSONResponse({"live": engine.is_running}, 200 if engine.is_running else 503)

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        ok = engine.is_running and not drain.draining
        return JSONResponse({"ready": ok}, 200 if ok else 503)

    @app.get("/v2/models/{model}")
    async def model_metadata(model: str) -> Response:
        return known(model) or JSONResponse(model_metadata_fields(model_name))

    @app.get("/v2/models/{model}/ready")
    async def model_ready(model: str) -> Response:
        ok = engine.is_running and not drain.draining
        return known(model) or JSONResponse({"name": model, "ready": ok}, 200 if ok else 503)

    async def serve(model: str, request: Request, stream: bool) -> Response:
        refused = known(model)
        if refused is not None:
            return refused
        return await until_disconnect(request, _generate(serving, model, request, stream))

    @app.post("/v2/models/{model}/generate")
    async def generate(model: str, request: Request) -> Response:
        return await serve(model, request, stream=False)

    @app.post("/v2/models/{model}/generate_stream")
    async def generate_stream(model: str, request: Request) -> Response:
        return await serve(model, request, stream=True)


def model_metadata_fields(model_name: str) -> dict:
    """The model's v2 metadata: Triton's generate tensors."""
    return {
        "name": model_name,
        "versions": [MODEL_VERSION],
        "platform": "llmc",
        "inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1]},
            {"name": "max_tokens", "datatype": "INT32", "shape": [1]},
            {"name": "stream", "datatype": "BOOL", "shape": [1]},
        ],
        "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}],
    }


async def _generate(serving, model: str, request: Request, stream: bool) -> Response:
    """Serve one generate request as the ``/v1/completions`` request it spells."""
    try:
        body = json.loads(await request.body())  # read before the disconnect watch starts
        completion = CompletionRequest.model_validate(completion_fields(body, model, stream))
        response = await serving.completion(completion, request.headers)
    except ApiError as exc:
        return _error(exc.status, exc.message)
    except (ValueError, ValidationError) as exc:  # not JSON, or fields the request refuses
        return _error(400, first_error(exc))
    if isinstance(response, StreamingResponse):
        events = _v2_events(response.body_iterator, model)
        return StreamingResponse(events, media_type="text/event-stream")
    choice = json.loads(response.body)["choices"][0]
    return JSONResponse(_output(model, choice["text"], choice["finish_reason"]))


def completion_fields(body: Any, model: str, stream: bool) -> dict:
    """The ``/v1/completions`` fields of a generate body. Raises ValueError for a body that
    is not an object with a string ``text_input``."""
    if not isinstance(body, dict) or not isinstance(body.get("text_input"), str):
        raise ValueError('the body must be a JSON object with a string "text_input"')
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ValueError('"parameters" must be a JSON object')
    top = {k: v for k, v in body.items() if k not in ("text_input", "parameters")}
    sampling = {k: v for k, v in (top | parameters).items() if k not in _NOT_SAMPLING}
    return sampling | {"model": model, "prompt": body["text_input"], "stream": stream}


async def completion_events(chunks: AsyncIterator) -> AsyncIterator[dict]:
    """The JSON events of an OpenAI completion stream's body chunks (``data: {...}`` lines;
    ``[DONE]`` and comments skipped)."""
    async for chunk in chunks:
        text = chunk.decode() if isinstance(chunk, bytes) else chunk
        for line in text.split("\n"):
            if line.startswith("data: {"):
                yield json.loads(line.removeprefix("data: "))


async def _v2_events(chunks: AsyncIterator, model: str) -> AsyncIterator[str]:
    """The OpenAI stream's chunks as v2 generate events: ``data: {"text_output": delta}``."""
    async for event in completion_events(chunks):
        if "error" in event:
            yield f"data: {json.dumps({'error': event['error'].get('message')})}\n\n"
            continue
        for choice in event.get("choices", []):
            output = _output(model, choice.get("text", ""), choice.get("finish_reason"))
            yield f"data: {json.dumps(output)}\n\n"


def _output(model: str, text: str, finish_reason: str | None) -> dict:
    out = {"model_name": model, "model_version": MODEL_VERSION, "text_output": text}
    if finish_reason is not None:
        out["finish_reason"] = finish_reason
    return out


def _error(status: int, message: str) -> JSONResponse:
    """The protocol's error body."""
    return JSONResponse({"error": message}, status_code=status)


def first_error(exc: Exception) -> str:
    """A request's first validation error as one line (``field: message``), or the error's
    text; for the protocol's 400 bodies."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
    return str(exc)
