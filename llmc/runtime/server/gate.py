"""The ASGI middleware every request passes before a route: HEAD, API key, drain, body size,
UTF-8.

In order: ``HEAD`` is served as ``GET`` without the body, on every route (Starlette answers a
``HEAD`` to a ``GET`` route with 405); routes other than ``/health``, ``/ready`` and ``/metrics``
need exactly one ``Authorization: Bearer <key>`` header when the server has a key (401, checked
before the body is read; ``api_key.py``); while the server drains, ``/v1`` answers 503 with
``Retry-After``; a body over the size cap is refused with 413 (at once from
``Content-Length``, else as soon as the received bytes pass the cap, chunked uploads included);
a body that is not UTF-8 gets 400. The body is read here and replayed to the app, after which
``receive`` is the server's own, so client disconnects still reach the app. ``/v1`` requests
are counted for the drain.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from llmc.runtime.server.api_key import authorized
from llmc.runtime.server.drain import Drain
from llmc.runtime.server.errors import error_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC_PATHS = frozenset({"/health", "/ready", "/metrics"})


class _TooLarge(Exception):
    pass


class RequestGate:
    """Pure ASGI middleware (no buffering of responses, streaming untouched).

    Args:
        app: the wrapped app.
        drain: the drain state (read for ``draining``, ``active`` counted here).
        api_key: the bearer token required outside ``PUBLIC_PATHS``; None: no check.
        max_body_bytes: the largest request body accepted, bytes.
        retry_after_s: ``Retry-After`` of the 503 sent while draining, seconds.
    """

    def __init__(
        self,
        app: ASGIApp,
        drain: Drain,
        api_key: str | None,
        max_body_bytes: int,
        retry_after_s: int = 1,
    ) -> None:
        self.app = app
        self.drain = drain
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "HEAD":
            scope, send = {**scope, "method": "GET"}, _without_body(send)
        path = scope["path"]
        if path in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        auth = [v for k, v in scope["headers"] if k.lower() == b"authorization"]
        if self.api_key is not None and not authorized(auth, self.api_key):
            await error_response(
                401,
                "Incorrect or missing API key: send one 'Authorization: Bearer <key>' header.",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )(scope, receive, send)
            return
        is_api = path.startswith("/v1/")
        if is_api and self.drain.draining:
            await error_response(
                503,
                "The server is shutting down and takes no new requests; retry elsewhere.",
                "server_error",
                code="server_shutting_down",
                headers={"Retry-After": str(self.retry_after_s)},
            )(scope, receive, send)
            return
        try:
            body = await self._read_body(headers, receive)
        except _TooLarge:
            await error_response(
                413,
                f"The request body is larger than this server's limit of "
                f"{self.max_body_bytes} bytes.",
                code="request_too_large",
            )(scope, receive, send)
            return
        if headers.get("content-type", b"").startswith(b"application/json"):
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                await error_response(400, f"The request body is not valid UTF-8: {exc}.")(
                    scope, receive, send
                )
                return
        if is_api:
            self.drain.active += 1
        try:
            await self.app(scope, _replay(body, receive), send)
        finally:
            if is_api:
                self.drain.active -= 1

    async def _read_body(self, headers: dict[str, bytes], receive: Receive) -> bytes:
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _TooLarge
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return b""
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _without_body(send: Send) -> Send:
    """A ``send`` that keeps the response's status and headers (Content-Length included, as
    HTTP wants for HEAD) and drops its body."""

    async def send_head(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return send_head


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then the server's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
