"""The ingress deployment: llmc's own OpenAI app, its requests run on the engine replicas."""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI
from ray.serve.handle import DeploymentHandle

from llmc.deploy.ray.pool import ReplicaCollector, ReplicaPool
from llmc.runtime.server.api_key import resolve_api_key
from llmc.runtime.server.api_server import request_tracing
from llmc.runtime.server.app import build_app
from llmc.runtime.server.serve_config import ServeConfig


class OpenAIIngress:
    """The body of the ingress deployment (Ray Serve's ``serve.ingress`` with the app built at
    replica start, ``__serve_build_asgi_app__``): the same routes, validation, errors,
    streaming, tracing and metrics as ``llmc serve``, over a `ReplicaPool`.

    Args:
        replicas: the engine deployment's handle.
        model_name: the name clients pass as ``model``.
        config: `ServeConfig.to_dict` of the options; the http, limits and tracing groups
            apply here.
    """

    async def __init__(
        self, replicas: DeploymentHandle, model_name: str, config: dict[str, Any]
    ) -> None:
        self._config = ServeConfig.from_dict(config)
        self._model_name = model_name
        facts = await replicas.describe.remote()
        self._pool = ReplicaPool(replicas, facts)

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Ray Serve's hook: the ASGI app this ingress serves."""
        http = self._config.http
        app = build_app(
            self._pool,
            self._model_name,
            api_key=resolve_api_key(http.api_key, http.api_key_file, os.environ),
            allowed_origins=http.allowed_origins,
            limits=self._config.limits,
            tracing=request_tracing(self._config.tracing.otlp_traces_endpoint),
        )
        app.state.metrics.registry.register(ReplicaCollector(self._pool, self._model_name))
        return app
