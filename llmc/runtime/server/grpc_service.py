"""KServe v2 over gRPC (``GRPCInferenceService``, the Open Inference Protocol) with Triton's
generate tensors: ``llmc serve --grpc-port PORT``.

RPCs: ``ServerLive``, ``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata``,
``ModelInfer`` (one response) and ``ModelStreamInfer`` (bidirectional; a request with input
``stream`` true gets one response per text delta, the last with parameter
``triton_final_response`` true, as Triton's decoupled models answer). Inputs, all of shape
``[1]``: ``text_input`` (BYTES, required), ``max_tokens`` (INT32), ``stream`` (BOOL), any
sampling option of ``/v1/completions`` by name (``temperature``, ``top_p``, ``seed``, ...;
Triton's ``random_seed`` is ``seed``), or the same in the request's ``parameters`` or a
``sampling_parameters`` JSON input (Triton's vLLM backend). Output: ``text_output`` (BYTES),
parameter ``finish_reason``.

A request is served as the ``/v1/completions`` request it spells (``kserve_v2.completion_fields``:
the same validation, limits, sampling and metrics), so its tokens are those of
``/v1/completions``. Errors carry the HTTP route's meaning as gRPC status codes (400
INVALID_ARGUMENT, 401 UNAUTHENTICATED, 404 NOT_FOUND, 413 RESOURCE_EXHAUSTED, 503 UNAVAILABLE);
in a stream, ``error_message``. The stubs are tritonclient's (``tritonclient[grpc]``).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from pydantic import ValidationError
from tritonclient.grpc import service_pb2, service_pb2_grpc

from llmc.runtime.server.drain import Drain
from llmc.runtime.server.engine_client import EngineClient
from llmc.runtime.server.errors import ApiError
from llmc.runtime.server.grpc_tensors import TensorError, input_values, text_output
from llmc.runtime.server.kserve_v2 import (
    MODEL_VERSION,
    completion_events,
    completion_fields,
    first_error,
    model_metadata_fields,
)
from llmc.runtime.server.protocol import CompletionRequest
from llmc.version import __version__

_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
#: Triton inputs that name no sampling option: the output never repeats the prompt, and token
#: counts are in the usage of the OpenAI routes.
_IGNORED = {"exclude_input_in_output", "return_num_input_tokens", "return_num_output_tokens"}
_RENAMED = {"random_seed": "seed", "stop_words": "stop"}


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """``GRPCInferenceService`` over the app's serving code (see the module).

    Args:
        serving: the app's ``OpenAIServing``.
        model_name: the one model served.
        engine: its engine (liveness).
        drain: the app's drain (readiness; new requests get UNAVAILABLE while it drains).
        api_key: when set, every RPC but the health ones needs metadata ``authorization:
            Bearer <api_key>``.
    """

    def __init__(
        self, serving: Any, model_name: str, engine: EngineClient, drain: Drain, api_key: str | None
    ) -> None:
        self.serving = serving
        self.model_name = model_name
        self.engine = engine
        self.drain = drain
        self.api_key = api_key

    async def ServerLive(self, request, context):  # noqa: N802 (the protocol's names)
        return service_pb2.ServerLiveResponse(live=self.engine.is_running)

    async def ServerReady(self, request, context):  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=self._ready())

    async def ModelReady(self, request, context):  # noqa: N802
        return service_pb2.ModelReadyResponse(
            ready=request.name == self.model_name and self._ready()
        )

    async def ServerMetadata(self, request, context):  # noqa: N802
        return service_pb2.ServerMetadataResponse(
            name="llmc", version=__version__, extensions=["generate"]
        )

    async def ModelMetadata(self, request, context):  # noqa: N802
        await self._check(request.name, context)
        fields = model_metadata_fields(self.model_name)
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=fields["name"],
            versions=fields["versions"],
            platform=fields["platform"],
            inputs=[tensor(**t) for t in fields["inputs"]],
            outputs=[tensor(**t) for t in fields["outputs"]],
        )

    async def ModelInfer(self, request, context):  # noqa: N802
        await self._check(request.model_name, context)
        try:
            stream, body = _body(request)
            if stream:
                raise ApiError(
                    400, "stream is true: call ModelStreamInfer", "invalid_request_error"
                )
            responses = [r async for r in self._infer(request, body, False, context)]
        except ApiError as exc:
            await context.abort(_STATUS.get(exc.status, grpc.StatusCode.INTERNAL), exc.message)
        return responses[-1]

    async def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
        await self._check(None, context)
        async for request in request_iterator:
            try:
                if request.model_name != self.model_name:
                    raise ApiError(
                        404, f"model {request.model_name!r} does not exist", "not_found_error"
                    )
                stream, body = _body(request)
                async for response in self._infer(request, body, stream, context):
                    yield service_pb2.ModelStreamInferResponse(infer_response=response)
            except ApiError as exc:
                yield service_pb2.ModelStreamInferResponse(error_message=exc.message)

    async def _infer(
        self, request, body: dict, stream: bool, context
    ) -> AsyncIterator[service_pb2.ModelInferResponse]:
        """The responses of one request: one, or one per text delta when ``stream``."""
        if self.drain.draining:
            raise ApiError(503, "the server is draining; retry on another", "server_error")
        try:
            fields = completion_fields(body, self.model_name, stream)
            completion = CompletionRequest.model_validate(fields)
        except (ValueError, ValidationError) as exc:
            raise _invalid(first_error(exc)) from exc
        headers = {k: v for k, v in context.invocation_metadata() or () if k == "traceparent"}
        response = await self.serving.completion(completion, headers)
        if not stream:
            choice = json.loads(response.body)["choices"][0]
            yield _response(request, self.model_name, choice["text"], choice["finish_reason"])
            return
        chunks = response.body_iterator
        try:
            async for text, finish_reason in _deltas(chunks):
                yield _response(request, self.model_name, text, finish_reason, final=False)
        finally:
            await chunks.aclose()  # a cancelled call aborts the request
        yield _response(request, self.model_name, "", None, final=True)

    def _ready(self) -> bool:
        return self.engine.is_running and not self.drain.draining

    async def _check(self, model: str | None, context) -> None:
        """Abort the call without the API key, or for another model."""
        if self.api_key is not None:
            given = dict(context.invocation_metadata() or ()).get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid API key")
        if model is not None and model != self.model_name:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model {model!r} does not exist")


def _body(request: service_pb2.ModelInferRequest) -> tuple[bool, dict]:
    """(stream, the generate body ``{"text_input", "parameters"}``) of a request.

    Raises:
        ApiError: 400 for tensors that cannot be read or a ``sampling_parameters`` that is not
            a JSON object.
    """
    try:
        values = input_values(request)
    except TensorError as exc:
        raise _invalid(str(exc)) from exc
    parameters = {k: _parameter(v) for k, v in request.parameters.items()}
    sampling = values.pop("sampling_parameters", None)
    if sampling is not None:
        try:
            parameters.update(json.loads(sampling))
        except (ValueError, TypeError) as exc:
            raise ApiError(
                400, "sampling_parameters must be a JSON object", "invalid_request_error"
            ) from exc
    for name, value in values.items():
        if name != "text_input" and name not in _IGNORED:
            parameters[_RENAMED.get(name, name)] = value
    stream = bool(parameters.pop("stream", False))
    for name in _IGNORED:
        parameters.pop(name, None)
    return stream, {"text_input": values.get("text_input"), "parameters": parameters}


def _invalid(message: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error")


def _parameter(value: service_pb2.InferParameter) -> Any:
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


async def _deltas(chunks: AsyncIterator) -> AsyncIterator[tuple[str, str | None]]:
    """(text delta, finish reason) of each choice event of an OpenAI completion stream.

    Raises:
        ApiError: 500 for an error event (the request failed mid-stream).
    """
    async for event in completion_events(chunks):
        if "error" in event:
            raise ApiError(500, event["error"].get("message", "failed"), "server_error")
        for choice in event.get("choices", []):
            yield choice.get("text", ""), choice.get("finish_reason")


def _response(
    request, model: str, text: str, finish_reason: str | None, final: bool | None = None
) -> service_pb2.ModelInferResponse:
    tensor, raw = text_output(text)
    response = service_pb2.ModelInferResponse(
        model_name=model,
        model_version=MODEL_VERSION,
        id=request.id,
        outputs=[tensor],
        raw_output_contents=[raw],
    )
    if finish_reason is not None:
        response.parameters["finish_reason"].string_param = finish_reason
    if final is not None:
        response.parameters["triton_final_response"].bool_param = final
    return response


async def start_grpc_server(
    address: str, servicer: InferenceServicer, max_message_bytes: int
) -> tuple[grpc.aio.Server, int]:
    """Start a gRPC server for ``servicer`` on ``address`` (``host:port``; port 0: any free).

    Returns:
        The server (``await server.stop(grace)`` to stop it) and the port it bound.

    Raises:
        RuntimeError: the address could not be bound (grpc's error).
    """
    options = [("grpc.max_receive_message_length", max_message_bytes)]
    server = grpc.aio.server(options=options)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port(address)
    await server.start()
    return server, port
