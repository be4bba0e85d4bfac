"""The KServe v2 REST routes on the real server (127.0.0.1): health, metadata, and Triton's
generate extension giving the same greedy text as ``/v1/completions``, whole and streamed;
errors in the protocol's body."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.runtime.test_server import MODEL

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory


@pytest.fixture(scope="module")
def server(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    with running_server(engine, MODEL) as live:
        yield live


def test_health_and_metadata(server):
    url = server.url
    assert httpx.get(f"{url}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{url}/v2/health/ready").json() == {"ready": True}
    assert httpx.get(f"{url}/v2").json()["extensions"] == ["generate"]
    meta = httpx.get(f"{url}/v2/models/{MODEL}").json()
    assert meta["name"] == MODEL and meta["versions"] == ["1"]
    assert [t["name"] for t in meta["inputs"]][0] == "text_input"
    assert meta["outputs"] == [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}]
    assert httpx.get(f"{url}/v2/models/{MODEL}/ready").json() == {"name": MODEL, "ready": True}
    missing = httpx.get(f"{url}/v2/models/other")
    assert missing.status_code == 404 and "other" in missing.json()["error"]


def test_generate_gives_the_completions_text(server):
    url, prompt = server.url, "The capital of France is"
    openai = httpx.post(
        f"{url}/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0},
    ).json()
    want = openai["choices"][0]["text"]
    body = {"text_input": prompt, "parameters": {"max_tokens": 8, "temperature": 0}}
    r = httpx.post(f"{url}/v2/models/{MODEL}/generate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["text_output"] == want and out["model_name"] == MODEL
    assert out["finish_reason"] == openai["choices"][0]["finish_reason"]
    top_level = {"text_input": prompt, "max_tokens": 8, "temperature": 0}  # Triton accepts both
    assert httpx.post(f"{url}/v2/models/{MODEL}/generate", json=top_level).json() == out
    with httpx.stream("POST", f"{url}/v2/models/{MODEL}/generate_stream", json=body) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: ")]
    assert "".join(e["text_output"] for e in events) == want
    assert events[-1]["finish_reason"] == out["finish_reason"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"parameters": {}}, 400, "text_input"),
        ({"text_input": "x", "parameters": {"max_tokens": 0}}, 400, "max_tokens"),
        ({"text_input": "x", "parameters": {"temperature": "hot"}}, 400, "temperature"),
        ({"text_input": "x", "parameters": {"max_tokens": 10**7}}, 400, "max"),
    ],
)
def test_bad_requests_get_the_protocols_error_and_the_server_serves_on(server, body, status, says):
    r = httpx.post(f"{server.url}/v2/models/{MODEL}/generate", json=body)
    assert r.status_code == status and says in r.json()["error"], r.text
    ok = {"text_input": "Hi", "parameters": {"max_tokens": 2}}
    assert httpx.post(f"{server.url}/v2/models/{MODEL}/generate", json=ok).status_code == 200
