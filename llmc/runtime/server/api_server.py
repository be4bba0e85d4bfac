"""``llmc serve``: load an engine directory and serve it over HTTP with uvicorn."""

from __future__ import annotations

import logging
from pathlib import Path

from llmc.runtime.server.app import build_app
from llmc.runtime.server.async_engine import AsyncLLMEngine

logger = logging.getLogger(__name__)


def serve(
    engine_dir: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    api_key: str | None = None,
    max_waiting: int = 64,
    drain_timeout_s: float | None = 30.0,
    log_level: str = "info",
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_model_len: int | None = None,
    kv_cache_memory: int | None = None,
) -> None:
    """Serve an engine directory with the OpenAI-compatible API until SIGINT or SIGTERM.

    On SIGINT/SIGTERM uvicorn stops accepting connections and lets in-flight requests finish
    (for at most ``drain_timeout_s``); then the engine thread is stopped. Blocks until then.

    Args:
        engine_dir: the engine directory (``manifest.json`` and engine files).
        host: interface to bind; the default serves only this machine.
        port: TCP port.
        model_name: the name clients pass as ``model``; default: the engine directory's name.
        api_key: when set, ``/v1/*`` requires ``Authorization: Bearer <api_key>``.
        max_waiting: requests that may wait for their first token before new ones get 503.
        drain_timeout_s: how long shutdown waits for in-flight requests, seconds; None: forever.
        log_level: uvicorn's log level.
        max_num_seqs, max_num_batched_tokens, max_model_len: engine limits (default: the
            engine's build limits).
        kv_cache_memory: KV-cache budget in bytes (default: the loader's).

    Raises:
        Whatever ``LLMEngine.from_engine_dir`` raises for a missing or mismatched engine.
    """
    import uvicorn

    from llmc.runtime.engine import LLMEngine

    name = model_name or Path(engine_dir).resolve().name
    limits = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_model_len": max_model_len,
    }
    llm_engine = LLMEngine.from_engine_dir(
        engine_dir,
        kv_cache_memory=kv_cache_memory,
        **{k: v for k, v in limits.items() if v is not None},
    )
    engine = AsyncLLMEngine(llm_engine, max_waiting=max_waiting)
    try:
        app = build_app(engine, name, api_key=api_key, owns_engine=True)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=drain_timeout_s,
        )
        logger.info("serving %s as model %r on http://%s:%d", engine_dir, name, host, port)
        uvicorn.Server(config).run()  # SIGINT/SIGTERM: drain, lifespan shutdown, exit
    finally:
        engine.shutdown()  # when uvicorn failed to start (e.g. the port is taken)
