"""HTTP/1.1 body framing against the real uvicorn server, on a raw socket: a request whose
framing two parsers could read differently (request smuggling) gets a 400 in OpenAI's error body
and its connection is closed, so nothing sent after it on that connection is answered; requests
framed by one header keep their connection alive."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import pytest

from llmc.runtime.server.framing import framing_error
from tests.runtime.test_server import MODEL

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

CMPL = json.dumps({"model": MODEL, "prompt": "Hello there", "max_tokens": 1}).encode()
CHUNKED_CMPL = b"%x\r\n%s\r\n0\r\n\r\n" % (len(CMPL), CMPL)
MODELS = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def served(tiny_llama_engine: Path, running_server: ServerFactory) -> Iterator[LiveServer]:
    from llmc.runtime.engine import LLMEngine

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    with running_server(engine, MODEL) as server:
        yield server


@pytest.fixture
def connection(served: LiveServer) -> Iterator[tuple[socket.socket, BinaryIO]]:
    """A raw socket to the server and a buffered reader of it; reads time out after 10 s."""
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        with sock.makefile("rb") as reader:
            yield sock, reader


def _post(headers: bytes, body: bytes) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n" + headers + b"\r\n" + body
    )


def _response(reader: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """The next response on the connection: status, headers (lower-case names), body (framed by
    Content-Length: the server's JSON responses are)."""
    status_line = reader.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, reader.read(int(headers["content-length"]))


def test_content_length_with_transfer_encoding_is_refused_and_the_connection_closed(
    connection: tuple[socket.socket, BinaryIO],
) -> None:
    sock, reader = connection
    both = b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(CHUNKED_CMPL)
    sock.sendall(_post(both, CHUNKED_CMPL) + MODELS)  # the second request is pipelined
    status, headers, body = _response(reader)
    assert (status, headers.get("connection")) == (400, "close"), body
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert "Content-Length and Transfer-Encoding" in error["message"]
    assert reader.read() == b""  # closed (a timeout otherwise): /v1/models is never answered


def test_requests_framed_by_one_header_keep_the_connection(
    connection: tuple[socket.socket, BinaryIO],
) -> None:
    sock, reader = connection
    sock.sendall(_post(b"Transfer-Encoding: chunked\r\n", CHUNKED_CMPL))
    status, headers, body = _response(reader)
    assert status == 200 and "connection" not in headers, body
    assert json.loads(body)["object"] == "text_completion"
    sock.sendall(_post(b"Content-Length: %d\r\n" % len(CMPL), CMPL))
    status, _, body = _response(reader)
    assert status == 200 and json.loads(body)["object"] == "text_completion"
    sock.sendall(MODELS)
    status, _, body = _response(reader)
    assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "Content-Length and Transfer"),
        (b"Transfer-Encoding: gzip, chunked\r\n", "only Transfer-Encoding accepted"),
        (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "only Transfer"),
        (b"Transfer-Encoding: xchunked\r\n", "only Transfer-Encoding accepted"),
        (b"Content-Length: 5\r\nContent-Length: 6\r\n", "different values"),
        (b"Content-Length: 5, 6\r\n", "different values"),
        (b"Content-Length: +5\r\n", "not a number"),
        (b"Content-Length: -1\r\n", "not a number"),
    ],
)
def test_ambiguous_framing_is_named(headers: bytes, problem: str) -> None:
    pairs = [tuple(h.split(b": ", 1)) for h in headers.removesuffix(b"\r\n").split(b"\r\n")]
    scope = {"http_version": "1.1", "headers": [(n.lower(), v) for n, v in pairs]}
    assert problem in framing_error(scope)


@pytest.mark.parametrize(
    ("version", "headers"),
    [
        ("1.1", [(b"transfer-encoding", b"Chunked")]),
        ("1.1", [(b"content-length", b"5"), (b"content-length", b"5")]),
        ("1.1", []),
        ("1.0", [(b"content-length", b"5")]),
    ],
)
def test_unambiguous_framing_passes(version: str, headers: list[tuple[bytes, bytes]]) -> None:
    assert framing_error({"http_version": version, "headers": headers}) is None


def test_transfer_encoding_in_http_1_0_is_refused() -> None:
    scope = {"http_version": "1.0", "headers": [(b"transfer-encoding", b"chunked")]}
    assert "HTTP/1.0" in framing_error(scope)
