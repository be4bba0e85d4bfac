"""Access to the real uvicorn server over a real tiny engine: the API key (exactly
one ``Authorization`` header; from ``--api-key``, ``--api-key-file`` or ``LLMC_API_KEY``), HEAD
wherever GET answers, and ``/health`` answering while a 4 MiB prompt is tokenized.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from llmc.bench.server_process import ServeProcess
from llmc.errors import EngineConfigError
from llmc.runtime.server.api_key import API_KEY_ENV, resolve_api_key
from llmc.runtime.server.limits import RequestLimits
from tests.runtime.test_server import MODEL
from tests.runtime.test_server_validation import AUTH, CHAT, CMPL, KEY, MESSAGE, C, H, _error

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

LIMITS = RequestLimits(max_request_body_bytes=8 << 20)  # room for a 4 MiB prompt


@pytest.fixture(scope="module")
def guarded(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    with running_server(engine, MODEL, max_waiting=8, api_key=KEY, limits=LIMITS) as server:
        yield server


@pytest.fixture
def http(guarded: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=guarded.url, timeout=120, headers=AUTH) as c:
        yield c


# --- D. API key and HEAD -----------------------------------------------------------------------


def test_two_authorization_headers_are_a_401(guarded: LiveServer) -> None:
    with httpx.Client(base_url=guarded.url, timeout=30) as c:
        for second in (f"Bearer {KEY}", "Bearer wrong"):
            headers = [("Authorization", f"Bearer {KEY}"), ("Authorization", second)]
            response = c.get("/v1/models", headers=headers)
            assert response.status_code == 401, response.text
            assert response.json()["error"]["code"] == "invalid_api_key"
        assert c.get("/v1/models", headers=AUTH).status_code == 200


def test_head_answers_wherever_get_does(guarded: LiveServer) -> None:
    with httpx.Client(base_url=guarded.url, timeout=30) as c:
        for path, headers in (("/health", {}), ("/ready", {}), ("/v1/models", AUTH)):
            get, head = c.get(path, headers=headers), c.head(path, headers=headers)
            assert (get.status_code, head.status_code) == (200, 200), path
            assert head.content == b"" and head.headers["content-length"] == str(len(get.content))
        assert c.head("/v1/models").status_code == 401  # HEAD is no way around the key
        assert c.head(C, headers=AUTH).status_code == 405


def test_api_key_comes_from_the_option_the_file_or_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("  from-file \n\n")
    env = {API_KEY_ENV: "from-env"}
    assert resolve_api_key("from-flag", None, env) == "from-flag"
    assert resolve_api_key(None, key_file, env) == "from-file"
    assert resolve_api_key(None, None, env) == "from-env"
    assert resolve_api_key(None, None, {API_KEY_ENV: ""}) is None
    assert resolve_api_key(None, None, {}) is None
    with pytest.raises(EngineConfigError, match="not both"):
        resolve_api_key("a", key_file, {})
    with pytest.raises(EngineConfigError, match="empty"):
        resolve_api_key(" ", None, {})
    with pytest.raises(EngineConfigError, match="cannot read"):
        resolve_api_key(None, tmp_path / "missing", {})
    for text, lines in (("", 0), ("a\nb\n", 2)):
        key_file.write_text(text)
        with pytest.raises(EngineConfigError, match=f"it has {lines} non-empty lines"):
            resolve_api_key(None, key_file, {})


def test_llmc_serve_takes_the_key_file_and_the_limit_flags(
    tmp_path: Path, tiny_llama_engine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    monkeypatch.delenv(API_KEY_ENV, raising=False)  # the key comes from the file alone
    flags = ["--api-key-file", str(key_file), "--max-n", "2", "--kv-cache-memory", "0.001"]
    flags += ["--shutdown-timeout", "1", "--served-model-name", MODEL]
    with (
        ServeProcess(tiny_llama_engine, flags, startup_timeout_s=120) as server,
        httpx.Client(base_url=server.url, timeout=30) as c,
    ):
        assert c.get("/v1/models").status_code == 401
        headers = {"Authorization": "Bearer from-file"}
        assert c.get("/v1/models", headers=headers).status_code == 200
        past = c.post(C, json=CMPL | {"n": 3}, headers=headers)
        assert "limit of 2 (max_n" in _error(past, 400, "n")
        assert c.post(C, json=CMPL | {"n": 2}, headers=headers).status_code == 200


# --- E. the event loop stays free --------------------------------------------------------------


@pytest.mark.parametrize("path", [C, H], ids=["completions", "chat"])
def test_health_answers_while_a_4_mib_prompt_is_tokenized(
    guarded: LiveServer, http: httpx.Client, path: str
) -> None:
    """A liveness bound, not a speed assertion: the whole prompt takes seconds to tokenize on
    these cores; ``/health`` must answer in well under a second while five of them are refused
    (it waited for the whole tokenization when that ran on the event loop, and ~0.5 s when the
    worker thread encoded it whole holding the GIL)."""
    text = ("Now is the winter of our discontent " * (4 << 15))[: 4 << 20]
    body = (
        CMPL | {"prompt": text} if path == C else CHAT | {"messages": [MESSAGE | {"content": text}]}
    )
    outcome: list[httpx.Response] = []
    big = threading.Thread(
        target=lambda: outcome.extend(http.post(path, json=body) for _ in range(5))
    )
    big.start()
    latencies = []
    with httpx.Client(base_url=guarded.url, timeout=30) as probe:
        while big.is_alive():
            start = time.monotonic()
            assert probe.get("/health").status_code == 200
            latencies.append(time.monotonic() - start)
            time.sleep(0.02)
    big.join()
    param = "prompt" if path == C else "messages"
    for response in outcome:
        assert "maximum context length is 128 tokens" in _error(response, 400, param)
    assert max(latencies) < 0.5, sorted(latencies)[-5:]
    assert latencies, latencies  # the probes ran while the prompts were refused
