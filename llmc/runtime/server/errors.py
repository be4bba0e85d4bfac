"""Errors of the HTTP server and their translation into OpenAI's error body.

Every failure the server reports has the shape OpenAI's clients parse::

    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

A bad request is a 4xx with a message that says what was wrong; nothing a client sends can
produce a 500 or stop the server.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from llmc.errors import StepFailedError

logger = logging.getLogger(__name__)


class ApiError(Exception):
    """An error returned to the client as ``status`` with OpenAI's error body.

    Args:
        status: HTTP status code.
        message: what was wrong and, where it helps, what to do.
        type: OpenAI's error type (``invalid_request_error``, ``server_error``, ...).
        param: the request field at fault, if one is.
        code: a machine-readable code (``model_not_found``, ``context_length_exceeded``, ...).
        headers: extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def response(self) -> JSONResponse:
        """The error as a JSON response."""
        return error_response(
            self.status, self.message, self.type, self.param, self.code, self.headers
        )


class QueueFullError(RuntimeError):
    """Raised by ``AsyncLLMEngine.generate`` when ``max_waiting`` requests already wait.

    The server answers 503 with ``Retry-After``; the client should retry later.
    """


class EngineDeadError(RuntimeError):
    """The engine thread has stopped (shut down, or a step raised); no request can be served."""


def error_response(
    status: int,
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A JSON response with OpenAI's error body. ``message`` and ``param`` may echo request text;
    anything in them that UTF-8 cannot encode (lone surrogates) is sent escaped (``\\ud800``),
    so the error body itself can always be sent."""
    message, param = _encodable(message), None if param is None else _encodable(param)
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 ``invalid_request_error``."""
    return ApiError(400, message, param=param, code=code)


def _encodable(text: str) -> str:
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_UNION_TAGS = frozenset({"str", "int", "float", "bool"})


def _path(loc: list[Any]) -> str:
    """``messages[0].content`` from pydantic's loc, without the union members' tags."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in _UNION_TAGS:
            path += f".{part}" if path else part
    return path


def _top_level(error: dict[str, Any]) -> str | None:
    loc = [part for part in error.get("loc", ()) if part != "body"]
    return str(loc[0]) if loc else None


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One readable message and the offending top-level field from pydantic's error list."""
    # A value error is the one a validator wrote; the others of a union (a string where a
    # list was allowed too) only say that the other members did not match either.
    first = next((e for e in errors if e.get("type") == "value_error"), errors[0])
    loc = [part for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return f"The request body is not valid JSON: {detail}".rstrip(": "), None
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if not loc:
        if first.get("type") in ("model_attributes_type", "dict_type", "model_type"):
            msg = "it must be a JSON object (send Content-Type: application/json)"
        elif first.get("type") == "string_unicode":  # a key with a lone surrogate
            msg = "a field name is not valid Unicode (it holds a lone surrogate)"
        return f"Invalid request body: {msg}", None
    param, path = str(loc[0]), _path(loc)
    if first.get("type") == "missing":
        return f"Missing required parameter: '{path}'.", param
    if first.get("type") == "extra_forbidden":
        if len(loc) == 1:  # OpenAI's words
            return f"Unrecognized request argument supplied: {param}", param
        return f"Unrecognized argument '{_path(loc[:-1])}.{loc[-1]}'.", param
    # Errors of the other members of a union are about the same value: not counted.
    fields = {_top_level(e) for e in errors} - {param, None}
    more = f" (and errors in {len(fields)} more fields)" if fields else ""
    return f"Invalid value for '{path}': {msg}{more}", param


async def _on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    if not errors:
        return error_response(400, "Invalid request body.")
    message, param = _validation_message(errors)
    return error_response(400, message, param=param)


async def _on_api_error(_: Request, exc: ApiError) -> JSONResponse:
    return exc.response()


async def _on_http_exception(request: Request, exc: HTTPException) -> JSONResponse:
    message = str(exc.detail)
    if exc.status_code in (404, 405):  # OpenAI's wording for a route that does not exist
        message = f"Invalid URL ({request.method} {request.url.path}): {message}"
    return error_response(exc.status_code, message, headers=exc.headers)


async def _on_engine_dead(_: Request, exc: EngineDeadError) -> JSONResponse:
    return error_response(503, str(exc), "server_error", code="engine_dead")


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error while serving a request", exc_info=exc)
    return error_response(500, f"Internal server error: {exc}", "server_error")


async def _on_step_failed(_: Request, exc: StepFailedError) -> JSONResponse:
    return error_response(500, str(exc), "server_error")


class UnexpectedErrorMiddleware:
    """Answers an exception that no handler took with a 500 in OpenAI's body, and keeps the
    client's keep-alive connection open.

    Starlette gives an ``Exception`` handler to its outermost ``ServerErrorMiddleware``, which
    sends the handler's response and then re-raises, so uvicorn logs the error and closes the
    connection: the client's next request on it fails with a reset. This ASGI middleware sits
    inside that one and does not re-raise when the response has not started (once it has, the
    stream is cut and the error goes on up).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            logger.exception("unhandled error while serving a request", exc_info=exc)
            response = error_response(500, f"Internal server error: {exc}", "server_error")
            await response(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the app can raise to OpenAI's error body."""
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(EngineDeadError, _on_engine_dead)
    app.add_exception_handler(StepFailedError, _on_step_failed)
    app.add_exception_handler(Exception, _on_unexpected)  # outside UnexpectedErrorMiddleware
    app.add_middleware(UnexpectedErrorMiddleware)
