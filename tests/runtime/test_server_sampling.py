"""The sampling fields of the OpenAI API and vLLM's extensions, end to end through the real
server: log-probs in both OpenAI formats (checked against the Hugging Face model's own
log-softmax), echo with prompt log-probs, n > 1 streamed and not, stop strings across token
boundaries while streaming, and every sampling field reaching the engine (server output ==
offline ``LLM`` output with the same ``SamplingParams``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
import torch

from llmc.runtime.sampling_params import SamplingParams
from tests.runtime.test_server import MODEL

if TYPE_CHECKING:
    from tests.conftest import ServerFactory

PROMPT = "ROMEO: But soft, what light through yonder"
TOL = 2e-3  # ONNX Runtime vs torch, float32


@pytest.fixture(scope="module")
def url(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[str]:
    from llmc.runtime.engine import LLMEngine

    with running_server(LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=64), MODEL) as s:
        yield s.url


@pytest.fixture(scope="module")
def hf(tiny_llama_dir: Path):  # noqa: ANN201
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.fixture
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def _log_softmax(hf, token_ids: list[int]) -> torch.Tensor:  # noqa: ANN001
    """[len(token_ids), vocab]: row i is the model's log-distribution of token i + 1."""
    with torch.no_grad():
        logits = hf[0](torch.tensor([token_ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def _ids(tokens: list[str]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in tokens]


def _events(http: httpx.Client, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json=body | {"stream": True}) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_completion_logprobs_and_echo_match_the_model(http: httpx.Client, hf) -> None:  # noqa: ANN001
    prompt_ids = hf[1].encode(PROMPT)
    body = {"model": MODEL, "prompt": prompt_ids, "max_tokens": 6, "temperature": 0}
    body |= {"ignore_eos": True, "logprobs": 3, "echo": True}
    choice = http.post("/v1/completions", json=body | {"return_tokens_as_token_ids": True})
    lp = choice.json()["choices"][0]["logprobs"]
    ids = _ids(lp["tokens"])
    assert ids[: len(prompt_ids)] == prompt_ids and len(ids) == len(prompt_ids) + 6
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    expected = _log_softmax(hf, ids)
    for i in range(1, len(ids)):
        row = expected[i - 1]
        assert lp["token_logprobs"][i] == pytest.approx(row[ids[i]].item(), abs=TOL)
        top3 = set(torch.topk(row, 3).indices.tolist()) | {ids[i]}
        top = {int(k.removeprefix("token_id:")): v for k, v in lp["top_logprobs"][i].items()}
        assert set(top) == top3
        for token_id, value in top.items():
            assert value == pytest.approx(row[token_id].item(), abs=TOL)
    for i in range(len(prompt_ids), len(ids)):  # greedy: the chosen token is the most likely
        assert ids[i] == int(expected[i - 1].argmax())

    # With token texts: the text starts with the prompt, offsets follow the token texts.
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    tokens, offsets = whole["logprobs"]["tokens"], whole["logprobs"]["text_offset"]
    assert whole["text"].startswith(hf[1].decode(prompt_ids))
    assert offsets[0] == 0
    assert [b - a for a, b in zip(offsets, offsets[1:], strict=False)] == [
        len(t) for t in tokens[:-1]
    ]
    # Streamed, the echo comes first and the pieces add up to the same text and log-probs.
    chunks = _events(http, "/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    streamed = [t for c in chunks for t in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == whole["logprobs"]["token_logprobs"]


def test_chat_logprobs_format(http: httpx.Client, url: str, hf) -> None:  # noqa: ANN001
    messages = [{"role": "user", "content": "To be, or not to be"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 5, "temperature": 0}
    body |= {"ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    as_ids = http.post("/v1/chat/completions", json=body | {"return_tokens_as_token_ids": True})
    content = as_ids.json()["choices"][0]["logprobs"]["content"]
    template = hf[1].apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = hf[1].encode(template, add_special_tokens=False)
    ids = _ids([entry["token"] for entry in content])
    expected = _log_softmax(hf, prompt_ids + ids)[len(prompt_ids) - 1 :]
    for i, entry in enumerate(content):
        assert entry["logprob"] == pytest.approx(expected[i, ids[i]].item(), abs=TOL)
        assert entry["bytes"] == list(entry["token"].encode())
        top = [
            (int(t["token"].removeprefix("token_id:")), t["logprob"]) for t in entry["top_logprobs"]
        ]
        assert [t for t, _ in top] == torch.topk(expected[i], 2).indices.tolist()
        assert top[0][0] == ids[i]  # greedy

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    typed = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    entries = typed.choices[0].logprobs.content
    assert len(entries) == 5 and all(len(e.top_logprobs) == 2 for e in entries)
    assert [e.logprob for e in entries] == [e["logprob"] for e in content]
    chunks = _events(http, "/v1/chat/completions", body)
    streamed = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert [e["logprob"] for e in streamed] == [e.logprob for e in entries]


def test_n_choices_streamed_and_whole(http: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "n": 3, "seed": 7}
    body |= {"temperature": 1.0, "ignore_eos": True}
    whole = http.post("/v1/completions", json=body).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2]
    assert [c["finish_reason"] for c in whole["choices"]] == ["length"] * 3
    assert whole["usage"]["completion_tokens"] == 18
    chunks = _events(http, "/v1/completions", body | {"stream_options": {"include_usage": True}})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    for i in range(3):
        mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] == i]
        assert "".join(c["text"] for c in mine) == whole["choices"][i]["text"]  # seeded
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["length"]

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "n": 2}
    chat_chunks = _events(http, "/v1/chat/completions", chat | {"max_tokens": 3})
    roles = [c["choices"][0]["index"] for c in chat_chunks if c["choices"][0]["delta"].get("role")]
    assert roles == [0, 1]
    ends = sorted(c["choices"][0]["index"] for c in chat_chunks if c["choices"][0]["finish_reason"])
    assert ends == [0, 1]


def test_stop_string_across_a_token_boundary_while_streaming(http: httpx.Client, hf) -> None:  # noqa: ANN001
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "temperature": 0}
    body |= {"ignore_eos": True}
    free = http.post(
        "/v1/completions", json=body | {"logprobs": 0, "return_tokens_as_token_ids": True}
    ).json()["choices"][0]
    text, ids = free["text"], _ids(free["logprobs"]["tokens"])
    # Character offsets where one token ends and the next begins (where the decode of the first
    # i tokens is a prefix of the text); a stop string made of the characters either side of
    # one, whose first match is there, spans two tokens.
    bounds = [len(p) for i in range(1, len(ids)) if text.startswith(p := hf[1].decode(ids[:i]))]
    stop = next(
        text[b - 2 : b + 2]
        for b in bounds
        if 2 <= b <= len(text) - 2
        and text[b - 2 : b + 2].isascii()
        and text[b - 2 : b + 2].strip() == text[b - 2 : b + 2]
        and text.find(text[b - 2 : b + 2]) == b - 2
        and b not in (b2 + 1 for b2 in bounds)  # the left token has 2+ characters
        and b + 1 not in bounds
    )
    expected = text[: text.index(stop)]
    stopped = body | {"stop": stop}
    whole = http.post("/v1/completions", json=stopped).json()["choices"][0]
    assert (whole["text"], whole["finish_reason"]) == (expected, "stop")
    chunks = [c["choices"][0] for c in _events(http, "/v1/completions", stopped)]
    assert "".join(c["text"] for c in chunks) == expected
    assert chunks[-1]["finish_reason"] == "stop"
    kept = _events(http, "/v1/completions", stopped | {"include_stop_str_in_output": True})
    assert "".join(c["choices"][0]["text"] for c in kept) == expected + stop


# Request fields -> the SamplingParams the offline API gets for the same request.
FIELD_CASES = [
    ({"temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": 3}, {}),
    ({"temperature": 1.0, "min_p": 0.2, "seed": 4}, {}),
    ({"temperature": 0, "presence_penalty": 2.0, "frequency_penalty": 2.0}, {}),
    ({"temperature": 0, "repetition_penalty": 1.5}, {}),
    ({"temperature": 0, "min_tokens": 6, "stop_token_ids": [5, 9, 17]}, {}),
    ({"temperature": 0, "stop": ["e", "a"], "include_stop_str_in_output": True}, {}),
]


def test_sampling_fields_reach_the_engine(http: httpx.Client, tiny_llama_engine: Path) -> None:
    from llmc.runtime.llm import LLM

    llm = LLM(tiny_llama_engine, num_blocks=64)
    base = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "ignore_eos": True}
    greedy = http.post("/v1/completions", json=base | {"temperature": 0}).json()
    for fields, _ in FIELD_CASES:
        served = http.post("/v1/completions", json=base | fields).json()["choices"][0]
        params = SamplingParams(max_tokens=40, ignore_eos=True, **fields)
        offline = llm.generate([PROMPT], params)[0].outputs[0]
        assert (served["text"], served["finish_reason"]) == (offline.text, offline.finish_reason)
        if "penalty" in json.dumps(fields):
            assert served["text"] != greedy["choices"][0]["text"], fields  # it took effect
