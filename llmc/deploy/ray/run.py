"""``llmc serve ENGINE --num-replicas N``: start Ray Serve here (or join a cluster) and serve
until SIGINT or SIGTERM, which drains."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import ray
from ray import serve

from llmc.deploy.ray.app import build_application
from llmc.runtime.server.serve_config import ServeConfig

logger = logging.getLogger(__name__)

#: The Ray Serve application's name.
APP_NAME = "llmc"
#: Ray Serve's controller kills an HTTP proxy that misses a 5 s ready check, and on a busy
#: 2-core host the proxy's start alone takes longer; a cluster started here gets these timeouts
#: unless the environment sets them (seconds).
PROXY_CHECK_ENV = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "120",
}


def serve_replicas(
    engine_dir: str | Path,
    config: ServeConfig,
    *,
    model_id: str | None = None,
    expected_manifest_sha256: str | None = None,
) -> None:
    """Serve ``engine_dir`` as Ray Serve replicas behind the OpenAI app on ``config.http``'s
    host and port; block until SIGINT or SIGTERM, then drain (in-flight requests finish for up
    to ``shutdown_timeout`` seconds) and stop Ray Serve.

    Args:
        engine_dir: the engine directory.
        config: every option; ``config.replicas`` says how many replicas and where Ray is.
        model_id: the registry's model id when ``engine_dir`` was resolved from it.
        expected_manifest_sha256: the registry's digest of ``manifest.json``, or None.

    Raises:
        Whatever Ray raises when the cluster cannot start or the application fails to deploy
        (a replica's engine refused its host, say: Ray names the replica's error).
    """
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if config.replicas.ray_address is None:  # read by the cluster's processes, started here
        for key, value in PROXY_CHECK_ENV.items():
            os.environ.setdefault(key, value)
    ray.init(address=config.replicas.ray_address, include_dashboard=False)
    try:
        start_serve(config.http.host, config.http.port)
        application = build_application(
            engine_dir,
            config,
            model_name=config.http.served_model_name or model_id,
            expected_manifest_sha256=expected_manifest_sha256,
        )
        serve.run(application, name=APP_NAME, route_prefix="/")
        logger.info(
            "serving %s on Ray Serve at http://%s:%d",
            engine_dir,
            config.http.host,
            config.http.port,
        )
        stop.wait()
        logger.info("draining (up to %.0f s)", config.lifecycle.shutdown_timeout)
        serve.shutdown()
    finally:
        ray.shutdown()


def start_serve(host: str, port: int) -> None:
    """Start Ray Serve (its controller and HTTP proxy on ``host:port``) in the connected cluster.

    Ray waits 60 s for the proxy and then raises, while the proxy goes on starting; on a busy
    host its start takes longer (imports on a loaded core), so a slow proxy is logged, not
    fatal: the routes answer once it is up (``/health`` tells).
    """
    try:
        serve.start(http_options={"host": host, "port": port})
    except TimeoutError as exc:
        logger.warning("Ray Serve's HTTP proxy is not up yet (%s); it goes on starting", exc)
