"""KServe v2 over gRPC on the real server (127.0.0.1), through Triton's own client
(``tritonclient.grpc``): health and metadata, ``ModelInfer`` and ``ModelStreamInfer`` giving the
same greedy text as ``/v1/completions``, and errors as gRPC status codes."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.runtime.test_server import MODEL  # noqa: E402

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    with running_server(engine, MODEL, grpc=True) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.app.state.grpc_port}")
    yield client
    client.close()


def _completion(server: LiveServer, **fields) -> dict:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **fields}
    return httpx.post(f"{server.url}/v1/completions", json=body).json()["choices"][0]


def _inputs(prompt: str, max_tokens: int, stream: bool | None = None, **floats: float) -> list:
    tensors = [("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES")]
    tensors.append(("max_tokens", np.array([max_tokens], dtype=np.int32), "INT32"))
    if stream is not None:
        tensors.append(("stream", np.array([stream], dtype=bool), "BOOL"))
    tensors += [(name, np.array([v], dtype=np.float32), "FP32") for name, v in floats.items()]
    inputs = []
    for name, value, datatype in tensors:
        tensor = grpcclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and not client.is_model_ready("other")
    assert client.get_server_metadata().extensions == ["generate"]
    meta = client.get_model_metadata(MODEL, as_json=True)
    assert meta["name"] == MODEL and meta["versions"] == ["1"]
    assert [t["name"] for t in meta["inputs"]][:2] == ["text_input", "max_tokens"]
    assert [t["name"] for t in meta["outputs"]] == ["text_output"]


def test_model_infer_gives_the_completions_text(server, client):
    want = _completion(server)
    result = client.infer(MODEL, _inputs(PROMPT, 8, temperature=0.0))
    assert result.as_numpy("text_output")[0].decode() == want["text"]
    response = result.get_response(as_json=True)
    assert response["parameters"]["finish_reason"]["string_param"] == want["finish_reason"]
    # vLLM backend's form: the sampling options as one JSON input
    options = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    options.set_data_from_numpy(np.array([json.dumps({"temperature": 0}).encode()], np.object_))
    again = client.infer(MODEL, [*_inputs(PROMPT, 8), options])
    assert again.as_numpy("text_output")[0].decode() == want["text"]


def test_model_stream_infer_streams_the_completions_text(server, client):
    want = _completion(server)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(MODEL, _inputs(PROMPT, 8, stream=True, temperature=0.0))
        text, final = "", False
        while not final:
            result, error = results.get(timeout=60)
            assert error is None, error
            text += result.as_numpy("text_output")[0].decode()
            params = result.get_response(as_json=True)["parameters"]
            final = params["triton_final_response"]["bool_param"]
        # a refused request in the stream gets its error and the stream goes on
        client.async_stream_infer("other", _inputs(PROMPT, 8, stream=True))
        result, error = results.get(timeout=60)
        assert result is None and "other" in str(error)
    finally:
        client.stop_stream()
    assert text == want["text"]


def test_errors_are_status_codes(client):
    with pytest.raises(InferenceServerException) as missing:
        client.infer("other", _inputs(PROMPT, 8))
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as too_long:
        client.infer(MODEL, _inputs("word " * 400, 8))
    assert too_long.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "maximum context length" in too_long.value.message()
    with pytest.raises(InferenceServerException) as streamed:
        client.infer(MODEL, _inputs(PROMPT, 8, stream=True))
    assert "ModelStreamInfer" in streamed.value.message()
    with pytest.raises(InferenceServerException) as bad:
        client.infer(MODEL, _inputs(PROMPT, 8, temperature=-1.0))
    assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
