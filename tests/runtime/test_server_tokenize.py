"""``/tokenize`` and ``/detokenize`` (vLLM's shapes) through the real server: the counts are the
ones the completion endpoints bill (``usage.prompt_tokens``), the ids the Hugging Face
tokenizer's, and bad input a 4xx in OpenAI's error body."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.runtime.test_server import MODEL

if TYPE_CHECKING:
    from tests.conftest import ServerFactory

PROMPT = "ROMEO: But soft, what light through yonder window breaks?"
MESSAGES = [
    {"role": "system", "content": "Answer in verse."},
    {"role": "user", "content": "Who is there?"},
]


@pytest.fixture(scope="module")
def url(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[str]:
    from llmc.runtime.engine import LLMEngine

    with running_server(LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=64), MODEL) as s:
        yield s.url


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_llama_dir: Path):  # noqa: ANN201
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.fixture
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def test_prompt_tokens_are_the_tokenizers_and_the_count_the_completion_bills(
    http: httpx.Client, hf_tokenizer
) -> None:
    got = http.post("/tokenize", json={"model": MODEL, "prompt": PROMPT, "return_token_strs": True})
    assert got.status_code == 200, got.text
    body = got.json()
    want = hf_tokenizer.encode(PROMPT, add_special_tokens=True)
    assert body["tokens"] == want and body["count"] == len(want)
    assert body["token_strs"] == hf_tokenizer.convert_ids_to_tokens(want)
    models = http.get("/v1/models").json()["data"][0]
    assert body["max_model_len"] == models["max_model_len"]
    billed = http.post(
        "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 1}
    ).json()
    assert billed["usage"]["prompt_tokens"] == body["count"]

    plain = http.post("/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}).json()
    assert plain["tokens"] == hf_tokenizer.encode(PROMPT, add_special_tokens=False)
    assert plain["token_strs"] is None


def test_conversation_count_is_what_chat_completions_bills(http: httpx.Client) -> None:
    body = http.post("/tokenize", json={"model": MODEL, "messages": MESSAGES}).json()
    billed = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 1}
    ).json()
    assert billed["usage"]["prompt_tokens"] == body["count"] > 0
    bare = http.post("/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False})
    assert bare.status_code == 200, bare.text
    # the tiny template's assistant header "<|assistant|>" is left off
    assert 0 < bare.json()["count"] < body["count"]


def test_detokenize_gives_back_the_text(http: httpx.Client, hf_tokenizer) -> None:
    ids = http.post("/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}).json()
    got = http.post("/detokenize", json={"model": MODEL, "tokens": ids["tokens"]})
    assert got.status_code == 200, got.text
    assert got.json() == {"prompt": hf_tokenizer.decode(ids["tokens"])}
    assert got.json()["prompt"] == PROMPT


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "other", "prompt": "hi"}, 404, "model"),
        ("/detokenize", {"model": "other", "tokens": [3]}, 404, "model"),
        ("/detokenize", {"tokens": [3, 512]}, 400, "tokens"),  # the vocabulary is 512
        ("/detokenize", {"tokens": []}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"tokens": [3], "bogus": 1}, 400, "bogus"),
        ("/tokenize", {"prompt": "hi", "bogus": 1}, 400, "bogus"),
        ("/tokenize", {"prompt": 3}, 400, "prompt"),
        ("/tokenize", {"prompt": "hi", "add_special_tokens": 1}, 400, "add_special_tokens"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"messages": MESSAGES, "bogus": 1}, 400, "bogus"),
        (
            "/tokenize",
            {"messages": MESSAGES, "add_generation_prompt": 0},
            400,
            "add_generation_prompt",
        ),
        ("/tokenize", {"messages": MESSAGES, "prompt": "hi"}, 400, "prompt"),
    ],
)
def test_bad_input_is_a_4xx_in_openais_error_body_naming_the_field(
    http: httpx.Client, path: str, body: dict, status: int, param: str
) -> None:
    got = http.post(path, json=body)
    assert got.status_code == status, got.text
    error = got.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    assert param in error["message"] and "Request" not in error["message"], error
    assert http.post("/tokenize", json={"prompt": "still serving"}).status_code == 200
