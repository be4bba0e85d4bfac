"""``FramingGuard``: refuses an HTTP/1.1 request whose body framing two parsers could read
differently, and closes its connection.

A request's body ends where ``Transfer-Encoding: chunked`` or ``Content-Length`` says (RFC 9112
§6.1, §6.3). When a request carries both, or a coding other than ``chunked``, or two different
lengths, a proxy in front of the server and the server itself may disagree on where the body
ends: the bytes one takes for body the other takes for the next request on the connection, and
that request bypasses the proxy's checks (request smuggling). RFC 9112 §6.3 lets a server reject
such a request or read it as chunked, and either way requires it to close the connection after
answering. uvicorn's parsers differ here (h11 reads both headers as chunked and keeps the
connection open; httptools refuses both headers itself but passes ``gzip, chunked``), so this
ASGI middleware holds the rule over whichever one runs: a 400 in OpenAI's error body with
``Connection: close``, which makes uvicorn close the connection under each of its HTTP/1.1
implementations, so nothing after the refused request is read. (A request the parser refuses
first gets uvicorn's own plain-text 400, and its connection is closed too.)
"""

from __future__ import annotations

from typing import Any

from llmc.runtime.server.errors import error_response


class FramingGuard:
    """ASGI middleware: a request that `framing_error` refuses gets a 400 with ``Connection:
    close`` and never reaches the app; every other one passes through untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        problem = framing_error(scope) if scope["type"] == "http" else None
        if problem is None:
            await self.app(scope, receive, send)
            return
        response = error_response(
            400, f"Invalid request framing: {problem}", headers={"Connection": "close"}
        )
        await response(scope, receive, send)


def framing_error(scope: dict) -> str | None:
    """What is wrong with the body framing of the ASGI HTTP request ``scope``, or None.

    Refused (RFC 9112 §6.1, §6.3): ``Transfer-Encoding`` together with ``Content-Length``;
    ``Transfer-Encoding`` other than exactly ``chunked`` (one coding, once), or in an HTTP/1.0
    request; ``Content-Length`` that is not digits, or given twice with different values.
    """
    codings: list[bytes] = []
    lengths: set[bytes] = set()
    for name, value in scope["headers"]:
        name = name.lower()
        if name == b"transfer-encoding":
            codings += [c.strip().lower() for c in value.split(b",")]
        elif name == b"content-length":
            lengths |= {v.strip() for v in value.split(b",")}
    if codings and lengths:
        return "Content-Length and Transfer-Encoding in one request; send only one of them"
    if codings and codings != [b"chunked"]:
        return "the only Transfer-Encoding accepted is chunked, once"
    if codings and scope.get("http_version") == "1.0":
        return "Transfer-Encoding in an HTTP/1.0 request"
    if len(lengths) > 1:
        return "Content-Length given more than once with different values"
    if lengths and not next(iter(lengths)).isdigit():
        return "Content-Length is not a number of bytes"
    return None
