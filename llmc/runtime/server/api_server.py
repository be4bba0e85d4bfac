"""``llmc serve``: load an engine directory and serve it over HTTP with uvicorn."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from llmc.runtime.server.api_key import resolve_api_key
from llmc.runtime.server.app import build_app
from llmc.runtime.server.async_engine import AsyncLLMEngine
from llmc.runtime.server.drain import ABORT_GRACE_S, DrainingServer
from llmc.runtime.server.limits import RequestLimits

logger = logging.getLogger(__name__)


def serve(
    engine_dir: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    api_key: str | None = None,
    api_key_file: str | None = None,
    max_waiting: int = 64,
    shutdown_timeout_s: float = 30.0,
    log_level: str = "info",
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_forked_seqs: int | None = None,
    max_model_len: int | None = None,
    kv_cache_memory: int | None = None,
    enable_prefix_caching: bool = True,
    allowed_origins: list[str] | None = None,
    limits: RequestLimits | None = None,
    expected_manifest_sha256: str | None = None,
    max_consecutive_step_failures: int = 3,
) -> None:
    """Serve an engine directory with the OpenAI-compatible API until SIGINT or SIGTERM.

    The first SIGTERM/SIGINT drains (``drain.py``): readiness turns false, new requests get
    503, in-flight ones finish for at most ``shutdown_timeout_s`` and the rest end with
    finish_reason "abort"; then the engine thread stops and the process exits. Blocks until
    then.

    Args:
        engine_dir: the engine directory (``manifest.json`` and engine files).
        host: interface to bind; the default serves only this machine.
        port: TCP port.
        model_name: the name clients pass as ``model``; default: the engine directory's name.
        api_key: when set, every route but /health, /ready, /metrics requires
            ``Authorization: Bearer <api_key>``.
        api_key_file: a file holding the key instead; with neither, ``$LLMC_API_KEY`` if set
            (``api_key.py``).
        max_waiting: requests that may wait for their first token before new ones get 503.
        shutdown_timeout_s: how long a drain lets in-flight requests run, seconds.
        log_level: uvicorn's log level.
        max_num_seqs, max_num_batched_tokens, max_model_len: engine limits (default: the
            engine's build limits).
        max_num_forked_seqs: most running completions 1..n-1 of n > 1 requests (default: half
            of max_num_seqs).
        kv_cache_memory: KV-cache budget in bytes (default: the loader's).
        enable_prefix_caching: share the KV blocks of common prompt prefixes between requests.
        allowed_origins: CORS origins (None: CORS off).
        limits: the bounds on one request; None: the defaults of `RequestLimits`.
        expected_manifest_sha256: the sha256 (hex) the engine's ``manifest.json`` must have
            (the registry's, when ``engine_dir`` was resolved from it); None: not checked.
        max_consecutive_step_failures: failed steps in a row after which the engine is taken
            to be broken (/health 503); one failed step only fails the requests it carried.

    Raises:
        EngineConfigError: both ``api_key`` and ``api_key_file``, or a key file that cannot be
            read or holds no key.
        Whatever ``LLMEngine.from_engine_dir`` raises for a missing or mismatched engine or a
        configuration that cannot work (``llmc.errors.EngineConfigError``).
    """
    import uvicorn

    from llmc.runtime.engine import LLMEngine

    key = resolve_api_key(api_key, api_key_file, os.environ)
    name = model_name or Path(engine_dir).resolve().name
    overrides = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_num_forked_seqs": max_num_forked_seqs,
        "max_model_len": max_model_len,
    }
    llm_engine = LLMEngine.from_engine_dir(
        engine_dir,
        kv_cache_memory=kv_cache_memory,
        enable_prefix_caching=enable_prefix_caching,
        expected_manifest_sha256=expected_manifest_sha256,
        **{k: v for k, v in overrides.items() if v is not None},
    )
    engine = AsyncLLMEngine(
        llm_engine,
        max_waiting=max_waiting,
        max_consecutive_step_failures=max_consecutive_step_failures,
    )
    try:
        app = build_app(
            engine,
            name,
            api_key=key,
            owns_engine=True,
            allowed_origins=allowed_origins,
            limits=limits,
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=int(ABORT_GRACE_S),
        )
        logger.info("serving %s as model %r on http://%s:%d", engine_dir, name, host, port)
        DrainingServer(config, app.state.drain, engine, shutdown_timeout_s).run()
    finally:
        engine.shutdown()  # when uvicorn failed to start (e.g. the port is taken)
