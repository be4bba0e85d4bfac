"""One streamed request to an OpenAI-compatible server, timed on the client.

Timing follows vLLM's ``benchmarks/lib/endpoint_request_func.py`` (``vllm bench serve``): the
request is sent with ``stream=True`` and ``stream_options.include_usage``; TTFT is the time from
sending to the first server-sent event that carries a choice; every later such event adds one
inter-token latency (ITL: the gap since the previous one); the end-to-end latency ends at the last
such event; the output token count is the final usage chunk's ``completion_tokens`` (when the
server sends none: the number of content events, which undercounts when a server bundles tokens).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from llmc.bench.dataset import BenchRequest


@dataclass(frozen=True)
class Target:
    """Where and how requests go.

    Attributes:
        base_url: server root, e.g. ``http://127.0.0.1:8000`` (``/v1/...`` is appended).
        model: the ``model`` field of every request.
        endpoint: ``completions`` or ``chat``.
        api_key: sent as ``Authorization: Bearer``; None: no header.
        ignore_eos: send ``ignore_eos: true`` (vLLM's extension; other servers may ignore it).
        temperature: sampling temperature.
        json_schema: sent as ``response_format`` (``json_schema``) when set.
    """

    base_url: str
    model: str
    endpoint: str = "completions"
    api_key: str | None = None
    ignore_eos: bool = False
    temperature: float = 0.0
    json_schema: dict | None = None

    @property
    def url(self) -> str:
        path = "/v1/completions" if self.endpoint == "completions" else "/v1/chat/completions"
        return self.base_url.rstrip("/") + path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class RequestResult:
    """What one request did; times in seconds on ``time.perf_counter``'s clock.

    Attributes:
        success: the server streamed at least one token and ended the stream normally.
        error: why it failed, as a kind: ``http_<status>``, ``connect``, ``timeout``,
            ``protocol`` (connection dropped or malformed stream), ``stream_error`` (an error event
            in the stream), ``no_tokens``; None when it did not fail.
        error_detail: the server's message or the exception text.
        disconnected: the client closed the stream on purpose (``disconnect_after``); neither a
            success nor a failure.
        response_id: the ``id`` of the server's chunks.
        start: when the request was sent.
        ttft: time to first token.
        itl: the gaps between successive content events.
        latency: end-to-end latency (to the last content event).
        prompt_tokens, output_tokens: from the usage chunk (``output_tokens`` falls back to the
            number of content events); ``prompt_tokens`` is None when the server sent no usage.
        text: the streamed text.
        finish_reason: of the last choice.
    """

    success: bool = False
    error: str | None = None
    error_detail: str = ""
    disconnected: bool = False
    response_id: str | None = None
    start: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    latency: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0
    text: str = ""
    finish_reason: str | None = None


def request_body(target: Target, request: BenchRequest) -> dict:
    """The JSON body: streamed, with usage; ``max_tokens`` = ``request.output_len``; ``model``
    the request's own when it has one, else the target's."""
    body: dict = {
        "model": request.model or target.model,
        "max_tokens": request.output_len,
        "temperature": target.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.endpoint == "completions":
        body["prompt"] = request.prompt
    else:
        body["messages"] = [{"role": "user", "content": request.prompt}]
    if target.ignore_eos:
        body["ignore_eos"] = True
    if target.json_schema is not None:
        schema = {"name": "bench", "schema": target.json_schema, "strict": True}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    return body


async def send_request(
    client: httpx.AsyncClient, target: Target, request: BenchRequest
) -> RequestResult:
    """Send ``request``, read its stream, and time it. Never raises for a failed request: the
    failure is recorded in the result (kinds in `RequestResult`)."""
    result = RequestResult(start=time.perf_counter())
    last = result.start
    num_events = 0
    try:
        async with client.stream(
            "POST", target.url, json=request_body(target, request), headers=target.headers
        ) as response:
            if response.status_code != 200:
                await response.aread()
                result.error = f"http_{response.status_code}"
                result.error_detail = _error_message(response)
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, SSE comments (pings)
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = "stream_error"
                    result.error_detail = str(chunk["error"].get("message", chunk["error"]))
                    return result
                result.response_id = result.response_id or chunk.get("id")
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"].get("prompt_tokens")
                    result.output_tokens = chunk["usage"].get("completion_tokens") or 0
                if not chunk.get("choices"):
                    continue  # the usage-only chunk carries no token
                now = time.perf_counter()
                if result.ttft is None:
                    result.ttft = now - result.start
                else:
                    result.itl.append(now - last)
                last = now
                num_events += 1
                choice = chunk["choices"][0]
                result.text += _content(choice, target.endpoint)
                result.finish_reason = choice.get("finish_reason") or result.finish_reason
                if request.disconnect_after is not None and num_events >= request.disconnect_after:
                    result.disconnected = True
                    return result  # leaving the block closes the connection
    except httpx.TimeoutException as exc:
        result.error, result.error_detail = "timeout", repr(exc)
        return result
    except httpx.ConnectError as exc:
        result.error, result.error_detail = "connect", repr(exc)
        return result
    except (httpx.HTTPError, json.JSONDecodeError, AttributeError, TypeError) as exc:
        result.error, result.error_detail = "protocol", repr(exc)
        return result
    if result.ttft is None:
        result.error, result.error_detail = "no_tokens", "the stream ended without a token"
        return result
    result.success = True
    result.latency = last - result.start
    result.output_tokens = result.output_tokens or num_events
    return result


def _content(choice: dict, endpoint: str) -> str:
    if endpoint == "completions":
        return choice.get("text") or ""
    return (choice.get("delta") or {}).get("content") or ""


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]
