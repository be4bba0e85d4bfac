"""Fixtures shared by the test modules: the tiny checkpoint, its engine and tokenizer, made once
per session where several modules used the same ones; and the real server on 127.0.0.1, one
harness for every set of server options.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.tiny_models import make_tiny_llama, train_tokenizer

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI
    from transformers import PreTrainedTokenizerBase

    from llmc.runtime.engine import LLMEngine
    from llmc.runtime.outputs import RequestOutput
    from llmc.runtime.server import AsyncLLMEngine
    from llmc.runtime.server.limits import RequestLimits

TINY_MAX_SEQ_LEN = 128  # the shared tiny engine's max_seq_len (its block size is 16)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama checkpoint (``make_tiny_llama``, seed 0); read-only."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny_llama") / "model")


@pytest.fixture(scope="session")
def tiny_llama_engine(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama built into a cpu engine directory (block size 16, max_seq_len 128), run by
    ONNX Runtime; read-only: a test that changes it works on a copy."""
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig

    config = BuildConfig.of(
        model=str(tiny_llama_dir),
        block_size=16,
        max_seq_len=TINY_MAX_SEQ_LEN,
        output=str(tmp_path_factory.mktemp("tiny_llama_engine") / "engine"),
    )
    return Path(build(config).engine_dir)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    """The tiny models' tokenizer (``train_tokenizer``) alone, without a checkpoint."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tiny_tokenizer")
    train_tokenizer(path)
    return AutoTokenizer.from_pretrained(path)


@dataclass
class LiveServer:
    """The real uvicorn server on a free port of 127.0.0.1, run on a background thread, over a
    real `LLMEngine` with two hooks: its aborts are recorded and its steps wait on a gate.

    Attributes:
        url: ``http://127.0.0.1:<port>``.
        app: the app (``app.state.drain`` is its drain state).
        engine: the `AsyncLLMEngine` the app serves; ``llm_engine`` is the engine it runs.
        aborted: the request ids passed to ``LLMEngine.abort_request``, in order.
        steps: ``LLMEngine.step`` waits for it: clear it to hold the engine between steps.
        uvicorn_server: the uvicorn server (a `DrainingServer` given a shutdown timeout).
        thread: the thread that runs ``uvicorn_server``.
    """

    url: str
    app: FastAPI
    engine: AsyncLLMEngine
    llm_engine: LLMEngine
    aborted: list[str]
    steps: threading.Event
    uvicorn_server: uvicorn.Server
    thread: threading.Thread


def _hook(engine: LLMEngine, aborted: list[str], steps: threading.Event) -> None:
    """Record ``engine``'s aborts in ``aborted``; make its steps wait for ``steps``."""
    abort, step = engine.abort_request, engine.step

    def spy_abort(request_id: str) -> None:
        aborted.append(request_id)
        abort(request_id)

    def gated_step() -> list[RequestOutput]:
        steps.wait()
        return step()

    engine.abort_request, engine.step = spy_abort, gated_step  # type: ignore[method-assign]


@contextmanager
def _running_server(
    engine: LLMEngine,
    model_name: str,
    *,
    max_waiting: int = 64,
    max_consecutive_step_failures: int = 3,
    api_key: str | None = None,
    allowed_origins: list[str] | None = None,
    limits: RequestLimits | None = None,
    shutdown_timeout_s: float | None = None,
    grammar_compile_timeout: float = 10.0,
    tracing=None,
    grpc: bool = False,
    allow_runtime_lora_updating: bool = False,
) -> Iterator[LiveServer]:
    """Serve ``engine`` as ``model_name`` until the block ends, then stop the server and the
    engine thread. The options are ``llmc serve``'s (``api_server.serve``); with
    ``shutdown_timeout_s`` the server drains on ``handle_exit`` as ``llmc serve`` does."""
    import uvicorn

    from llmc.runtime.server import AsyncLLMEngine, build_app
    from llmc.runtime.server.api_server import HTTP_PARSER
    from llmc.runtime.server.drain import DrainingServer

    aborted: list[str] = []
    steps = threading.Event()
    steps.set()
    _hook(engine, aborted, steps)
    async_engine = AsyncLLMEngine(
        engine,
        max_waiting=max_waiting,
        max_consecutive_step_failures=max_consecutive_step_failures,
        grammar_compile_timeout=grammar_compile_timeout,
    )
    try:
        app = build_app(
            async_engine,
            model_name,
            api_key=api_key,
            allowed_origins=allowed_origins,
            limits=limits,
            tracing=tracing,
            grpc_address="127.0.0.1:0" if grpc else None,
            allow_runtime_lora_updating=allow_runtime_lora_updating,
        )
        config = uvicorn.Config(app, log_level="warning", http=HTTP_PARSER)
        if shutdown_timeout_s is None:
            server = uvicorn.Server(config)
        else:
            server = DrainingServer(config, app.state.drain, async_engine, shutdown_timeout_s)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
            thread.start()
            try:
                deadline = time.monotonic() + 30
                while not server.started:
                    assert thread.is_alive() and time.monotonic() < deadline, "no server started"
                    time.sleep(0.02)
                yield LiveServer(url, app, async_engine, engine, aborted, steps, server, thread)
            finally:
                steps.set()  # a held engine would hold the shutdown
                server.should_exit = True
                thread.join(30)
    finally:
        async_engine.shutdown()


ServerFactory = Callable[..., AbstractContextManager[LiveServer]]


@pytest.fixture(scope="session")
def running_server() -> ServerFactory:
    """``running_server(engine, model_name, *, max_waiting=64, max_consecutive_step_failures=3,
    api_key=None, allowed_origins=None, limits=None, shutdown_timeout_s=None,
    grammar_compile_timeout=10.0, tracing=None, grpc=False, allow_runtime_lora_updating=False)``:
    a context
    manager serving ``engine`` (an `LLMEngine`) on 127.0.0.1; yields a `LiveServer`."""
    return _running_server


@pytest.fixture(autouse=True)
def _trusted_state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Registry commands remember verified versions under ``$XDG_STATE_HOME``: each test gets
    its own, never the real home directory's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
