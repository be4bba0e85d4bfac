"""``llmc serve``: load an engine directory and serve it over HTTP with uvicorn."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from llmc.runtime.lora.lora_request import LoRARequest
from llmc.runtime.server.api_key import resolve_api_key
from llmc.runtime.server.app import build_app
from llmc.runtime.server.async_engine import AsyncLLMEngine
from llmc.runtime.server.drain import ABORT_GRACE_S, DrainingServer
from llmc.runtime.server.serve_config import ServeConfig
from llmc.runtime.server.tracing import RequestTracing

logger = logging.getLogger(__name__)

#: uvicorn's HTTP/1.1 parser: h11, whichever else is installed (Ray Serve brings httptools, which
#: uvicorn would pick), because ``framing.FramingGuard``'s answers are written for h11's reading
#: of ambiguous framing (httptools answers some of them itself, in plain text).
HTTP_PARSER = "h11"


def serve(
    engine_dir: str | Path,
    config: ServeConfig | None = None,
    *,
    model_id: str | None = None,
    expected_manifest_sha256: str | None = None,
) -> None:
    """Serve an engine directory with the OpenAI-compatible API until SIGINT or SIGTERM.

    The first SIGTERM/SIGINT drains (``drain.py``): readiness turns false, new requests get
    503, in-flight ones finish for at most ``config.lifecycle.shutdown_timeout`` seconds and the
    rest end with finish_reason "abort"; then the engine thread stops and the process exits.
    Blocks until then.

    Args:
        engine_dir: the engine directory (``manifest.json`` and engine files).
        config: every option (see `ServeConfig`); None: the defaults.
        model_id: the registry's model id when ``engine_dir`` was resolved from it, the name
            clients pass as ``model`` unless ``served_model_name`` is set; None: the engine
            directory's name.
        expected_manifest_sha256: the sha256 (hex) the engine's ``manifest.json`` must have
            (the registry's, when ``engine_dir`` was resolved from it); None: not checked.

    Raises:
        EngineConfigError: both ``api_key`` and ``api_key_file``, or a key file that cannot be
            read or holds no key.
        Whatever ``LLMEngine.from_engine_dir`` raises for a missing or mismatched engine or a
        configuration that cannot work (``llmc.errors.EngineConfigError``).
    """
    import uvicorn

    config = config or ServeConfig()
    http, lifecycle = config.http, config.lifecycle
    key = resolve_api_key(http.api_key, http.api_key_file, os.environ)
    name = http.served_model_name or model_id or Path(engine_dir).resolve().name
    engine = start_engine(engine_dir, config, expected_manifest_sha256)
    try:
        app = build_app(
            engine,
            name,
            api_key=key,
            owns_engine=True,
            allowed_origins=http.allowed_origins,
            limits=config.limits,
            tracing=request_tracing(config.tracing.otlp_traces_endpoint),
            grpc_address=None if http.grpc_port is None else f"{http.host}:{http.grpc_port}",
            allow_runtime_lora_updating=config.lora.runtime_updating(os.environ),
        )
        uvicorn_config = uvicorn.Config(
            app,
            http=HTTP_PARSER,
            host=http.host,
            port=http.port,
            log_level=lifecycle.log_level,
            timeout_graceful_shutdown=int(ABORT_GRACE_S),
        )
        logger.info(
            "serving %s as model %r on http://%s:%d", engine_dir, name, http.host, http.port
        )
        DrainingServer(uvicorn_config, app.state.drain, engine, lifecycle.shutdown_timeout).run()
    finally:
        engine.shutdown()  # when uvicorn failed to start (e.g. the port is taken)


def start_engine(
    engine_dir: str | Path, config: ServeConfig, expected_manifest_sha256: str | None = None
) -> AsyncLLMEngine:
    """Load the engine directory with ``config``'s engine limits and start its thread.

    Args:
        engine_dir: the engine directory.
        config: the options; its ``engine`` and ``lifecycle`` groups apply.
        expected_manifest_sha256: as `serve`'s.

    Returns:
        The running engine, its grammar tables built (so that the first constraint does not
        stall the engine thread).

    Raises:
        As ``LLMEngine.from_engine_dir``; LoRAAdapterError for a ``--lora-modules`` adapter the
        engine cannot serve.
    """
    from llmc.runtime.engine import LLMEngine

    limits, lifecycle = config.engine, config.lifecycle
    llm_engine = LLMEngine.from_engine_dir(
        engine_dir,
        kv_cache_memory=limits.kv_cache_bytes,
        max_model_len=limits.max_model_len,
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_num_forked_seqs=limits.max_num_forked_seqs,
        max_decode_wait_steps=limits.max_decode_wait_steps,
        enable_prefix_caching=limits.enable_prefix_caching,
        expected_manifest_sha256=expected_manifest_sha256,
        speculative_config=limits.speculative,
        max_cpu_loras=config.lora.max_cpu_loras,
    )
    for i, (name, path) in enumerate(config.lora.modules, start=1):
        llm_engine.add_lora(LoRARequest(name, i, path))
    llm_engine.grammars.warm_up()
    return AsyncLLMEngine(
        llm_engine,
        max_waiting=lifecycle.max_waiting,
        max_consecutive_step_failures=lifecycle.max_consecutive_step_failures,
        grammar_compile_workers=lifecycle.grammar_compile_workers,
        grammar_compile_timeout=lifecycle.grammar_compile_timeout,
    )


def request_tracing(endpoint: str | None) -> RequestTracing | None:
    """Request tracing to the OTLP endpoint, or None (OpenTelemetry not imported)."""
    return RequestTracing.otlp(endpoint) if endpoint else None
