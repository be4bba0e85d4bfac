"""Graceful shutdown: on SIGTERM (or SIGINT) the server drains before it exits.

1. Readiness turns false (``/ready`` answers 503) so the load balancer stops sending traffic.
2. New requests get 503 with ``Retry-After``; the listening socket stays open meanwhile, so
   clients get an answer rather than a refused connection.
3. Requests in flight (queued or generating) run to completion, for at most the shutdown
   timeout; then the rest are aborted: each ends with what it generated so far and
   ``finish_reason: "abort"``, and its KV blocks are freed.
4. uvicorn then closes the socket and connections, the lifespan stops the engine thread, and the
   signal is re-raised (uvicorn's contract), so the exit status says "terminated by SIGTERM".

A second signal during the drain stops at once (uvicorn's own graceful shutdown). The hooks are
``uvicorn.Server.handle_exit`` (called by uvicorn's signal handler) and ``on_tick`` (its 0.1 s
main-loop tick), the documented way uvicorn decides when to exit.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn

from llmc.runtime.server.engine_client import EngineClient

# uvicorn configures its own loggers only: drain messages go to its server log.
logger = logging.getLogger("uvicorn.error")

# How long aborted requests get to send their last chunk before the server stops, seconds.
ABORT_GRACE_S = 5.0


@dataclass
class Drain:
    """The drain state shared by the app and the server process.

    Attributes:
        draining: set once shutdown began; readiness is false and ``/v1`` refuses requests.
        active: ``/v1`` requests being served (their responses not yet fully sent).
    """

    draining: bool = False
    active: int = 0


class DrainingServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose first SIGTERM/SIGINT drains (see the module docstring).

    Args:
        config: uvicorn's configuration.
        drain: the app's drain state (``app.state.drain``).
        engine: the app's engine; aborted when the timeout passes.
        shutdown_timeout_s: how long in-flight requests may run after the signal, seconds.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        engine: EngineClient,
        shutdown_timeout_s: float,
    ) -> None:
        super().__init__(config)
        self.drain = drain
        self.engine = engine
        self.shutdown_timeout_s = shutdown_timeout_s
        self._deadline = 0.0
        self._aborted_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        already = self.drain.draining
        super().handle_exit(sig, frame)  # records the signal for re-raising after shutdown
        if already:
            return  # a second signal: uvicorn's immediate graceful shutdown
        self.should_exit = False
        self.drain.draining = True
        self._deadline = time.monotonic() + self.shutdown_timeout_s
        logger.info(
            "%s: draining %d request(s), for at most %.1f s",
            signal.Signals(sig).name,
            self.drain.active,
            self.shutdown_timeout_s,
        )

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if not self.drain.draining:
            return False
        if self.drain.active == 0 and self.engine.num_in_flight == 0:
            logger.info("drained; shutting down")
            return True
        now = time.monotonic()
        if self._aborted_at is None and now >= self._deadline:
            logger.warning(
                "shutdown timeout of %.1f s passed: aborting %d request(s)",
                self.shutdown_timeout_s,
                self.engine.num_in_flight,
            )
            self.engine.abort_all()
            self._aborted_at = now
        return self._aborted_at is not None and now - self._aborted_at > ABORT_GRACE_S
