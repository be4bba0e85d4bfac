"""``/tokenize`` and ``/detokenize`` do bounded work, as the completion endpoints do: a text
certainly longer than the model's context is refused after a prefix of it is encoded
(``context_length_exceeded``, naming the field), so a multi-megabyte body cannot hold the
tokenizer thread, and the GIL, for seconds while others wait."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.runtime.test_server import MODEL

if TYPE_CHECKING:
    from tests.conftest import ServerFactory

# ~3.9 MiB of text, under the 4 MiB body cap: hundreds of thousands of tokens.
HUGE = "But soft, what light through yonder window breaks? " * 80_000


@pytest.fixture(scope="module")
def http(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[httpx.Client]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    with (
        running_server(engine, MODEL) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        yield client


def _context_error(response: httpx.Response, param: str) -> dict:
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == param
    assert "maximum context length is" in error["message"]
    return error


def test_a_prompt_far_past_the_context_is_refused_not_encoded(http):
    _context_error(http.post("/tokenize", json={"model": MODEL, "prompt": HUGE}), "prompt")
    ok = http.post("/tokenize", json={"model": MODEL, "prompt": HUGE[:200]})
    assert ok.status_code == 200 and ok.json()["count"] > 10


def test_a_conversation_far_past_the_context_is_refused_naming_messages(http):
    body = {"model": MODEL, "messages": [{"role": "user", "content": HUGE}]}
    _context_error(http.post("/tokenize", json=body), "messages")


def test_detokenize_refuses_more_ids_than_any_output(http):
    max_model_len = http.get("/v1/models").json()["data"][0]["max_model_len"]
    body = {"model": MODEL, "tokens": [5] * (2 * max_model_len + 1)}
    _context_error(http.post("/detokenize", json=body), "tokens")
    ok = http.post("/detokenize", json={"model": MODEL, "tokens": [5] * max_model_len})
    assert ok.status_code == 200 and ok.json()["prompt"]
