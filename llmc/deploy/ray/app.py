"""The Ray Serve application: engine replicas behind the OpenAI ingress."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from llmc.deploy.ray.ingress import OpenAIIngress
from llmc.deploy.ray.replica import EngineReplica
from llmc.deploy.ray.router import PrefixAffinityRouter
from llmc.errors import EngineConfigError
from llmc.runtime.server.serve_config import ServeConfig

#: How often replicas report their prefixes to the routers, seconds.
ROUTING_STATS_PERIOD_S = 2.0


def build_application(
    engine_dir: str | Path,
    config: ServeConfig,
    *,
    model_name: str | None = None,
    expected_manifest_sha256: str | None = None,
) -> Application:
    """The deployment graph: ``LLMCEngine`` replicas (`EngineReplica`, placed by
    `PrefixAffinityRouter` unless ``prefix_routing`` is off) behind ``LLMCIngress``
    (`OpenAIIngress`, one replica, no CPU reserved).

    Scaling (``config.replicas``): ``num_replicas`` fixed, or Ray's autoscaling between
    ``min_replicas`` and ``max_replicas`` on ``target_ongoing_requests`` (requests in each
    engine, queued or running). Each replica takes up to ``max_num_seqs + max_waiting``
    requests (its engine answers 503 past its own queue); the ingress's routers queue at most
    ``max_waiting`` more (then 503). Shutdown drains: replicas finish in-flight requests for up
    to ``shutdown_timeout`` seconds (Ray's graceful shutdown).

    Args:
        engine_dir: the engine directory, as every replica's node sees it.
        config: every ``llmc serve`` option.
        model_name: the name clients pass as ``model``; None: ``served_model_name`` or the
            engine directory's name.
        expected_manifest_sha256: the registry's digest of ``manifest.json``, or None.

    Returns:
        The application, for ``serve.run``.
    """
    scaling, lifecycle = config.replicas, config.lifecycle
    name = model_name or config.http.served_model_name or Path(engine_dir).resolve().name
    replicas = serve.deployment(
        EngineReplica,
        name="LLMCEngine",
        ray_actor_options={"num_cpus": scaling.replica_num_cpus},
        max_ongoing_requests=(config.engine.max_num_seqs or 256) + lifecycle.max_waiting,
        graceful_shutdown_timeout_s=lifecycle.shutdown_timeout,
        request_router_config=_router(scaling.prefix_routing),
        **_scaling(config),
    ).bind(str(engine_dir), config.to_dict(), expected_manifest_sha256)
    ingress = serve.deployment(
        serve.ingress()(OpenAIIngress),
        name="LLMCIngress",
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=10_000,  # admission is the engine's and the routers' (above)
        graceful_shutdown_timeout_s=lifecycle.shutdown_timeout,
    )
    return ingress.bind(replicas, name, config.to_dict())


def _router(prefix_routing: bool) -> RequestRouterConfig:
    """`PrefixAffinityRouter`, or Ray's default (power of two choices)."""
    if not prefix_routing:
        return RequestRouterConfig()
    return RequestRouterConfig(
        request_router_class=PrefixAffinityRouter,
        request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
    )


def _scaling(config: ServeConfig) -> dict[str, Any]:
    scaling = config.replicas
    queue = {"max_queued_requests": config.lifecycle.max_waiting}
    if not scaling.autoscaling:
        return {"num_replicas": scaling.num_replicas or 1, **queue}
    autoscaling = {
        "min_replicas": scaling.min_replicas or 1,
        "max_replicas": scaling.max_replicas or max(scaling.min_replicas or 1, 1),
        "target_ongoing_requests": scaling.target_ongoing_requests,
        "upscale_delay_s": scaling.upscale_delay_s,
        "downscale_delay_s": scaling.downscale_delay_s,
    }
    return {"autoscaling_config": autoscaling, **queue}


def app(args: dict[str, str]) -> Application:
    """Ray's application builder: ``serve run llmc.deploy.ray:app engine=DIR [option=value
    ...]`` (or a Serve config file's ``import_path: llmc.deploy.ray:app`` with ``args``).

    Args:
        args: ``engine`` (the engine directory) and any ``llmc serve`` option by name, each
            value a YAML scalar (``num_replicas=2``, ``prefix_routing=false``).

    Raises:
        EngineConfigError: no ``engine``, or as `ServeConfig.from_dict`.
    """
    engine = args.get("engine")
    values = {
        k: yaml.safe_load(v) if isinstance(v, str) else v for k, v in args.items() if k != "engine"
    }
    if not engine:
        raise EngineConfigError(
            "give the engine directory: serve run llmc.deploy.ray:app engine=DIR"
        )
    return build_application(str(engine), ServeConfig.from_dict(values))
