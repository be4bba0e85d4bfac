"""Server-sent events of one request: its ``n`` choices streamed as text deltas, then the usage
chunk if asked for, then ``data: [DONE]``; and the per-request latency bookkeeping.

Engine outputs are cumulative, and the async engine may skip intermediate ones, so each
choice's delta is cut from its cumulative text: the characters and tokens after what was sent.
A chunk is sent when a choice has new text or finishes; tokens whose text is still held back
(an incomplete character, a possible stop string) ride with the next chunk. Choices finish
independently, each with its own ``finish_reason``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from pydantic import BaseModel

from llmc.runtime.outputs import RequestOutput
from llmc.runtime.server.metrics import ServerMetrics
from llmc.runtime.server.renderers import ChunkSpan, Renderer
from llmc.runtime.server.responses import UsageInfo
from llmc.runtime.server.tracing import RequestSpan
from llmc.runtime.structured.grammar import GrammarError

logger = logging.getLogger(__name__)


class RequestTracker:
    """Records one request's TTFT, inter-token latencies and end in the server metrics.

    Args:
        metrics: where to record.
        num_prompt_tokens: the request's prompt length.
        arrival: when the request arrived, ``time.monotonic()`` seconds.
        span: the request's trace span (``tracing.RequestSpan``), ended by ``finish``; None
            when the server does not trace.
    """

    def __init__(
        self,
        metrics: ServerMetrics,
        num_prompt_tokens: int,
        arrival: float,
        span: RequestSpan | None = None,
    ) -> None:
        self.metrics = metrics
        self.num_prompt_tokens = num_prompt_tokens
        self.arrival = arrival
        self.span = span
        self.ttft_s: float | None = None
        self.last: RequestOutput | None = None
        self._num_tokens = 0
        self._last_time = arrival
        self._done = False

    def update(self, output: RequestOutput) -> None:
        """Account for one (cumulative) engine output."""
        now = time.monotonic()
        num_tokens = sum(len(o.token_ids) for o in output.outputs)
        if self.last is None:
            self.ttft_s = now - self.arrival
            self.metrics.observe_first_token(self.ttft_s)
        elif num_tokens > self._num_tokens:
            self.metrics.observe_tokens(num_tokens - self._num_tokens, now - self._last_time)
        if num_tokens > self._num_tokens:
            self._last_time = now
        self._num_tokens = num_tokens
        self.last = output

    def usage(self) -> UsageInfo:
        """Token usage so far (all choices)."""
        return UsageInfo.of(self.num_prompt_tokens, self._num_tokens)

    def finish(self) -> None:
        """Record the request's tokens and latency once (its outcome is counted by the
        engine, ``AsyncLLMEngine.num_finished``)."""
        if self._done:
            return
        self._done = True
        e2e_s = time.monotonic() - self.arrival
        self.metrics.observe_finished(self.num_prompt_tokens, self._num_tokens, e2e_s)
        if self.span is not None:
            self.span.finish(
                self.last, self.num_prompt_tokens, self._num_tokens, self.ttft_s, e2e_s
            )


@dataclass
class _ChoiceState:
    chars: int = 0
    tokens: int = 0
    started: bool = False
    done: bool = False


async def sse_events(
    first: RequestOutput,
    rest: AsyncIterator[RequestOutput],
    renderer: Renderer,
    tracker: RequestTracker,
    num_choices: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The request's server-sent events (see the module docstring); an engine failure after
    the headers are sent is reported in-band as an error event, as vLLM does."""
    states = [_ChoiceState() for _ in range(num_choices)]
    async with aclosing(rest):
        try:
            for index in range(num_choices):
                opening = renderer.opening(index)
                if opening is not None:
                    yield sse_event(opening)
            output = first
            while True:
                for out in output.outputs:
                    state = states[out.index]
                    if state.done:
                        continue
                    delta = out.text[state.chars :]
                    due = delta or out.finish_reason or (renderer.prefix and not state.started)
                    if not due or (renderer.buffered and not out.finish_reason):
                        continue
                    span = ChunkSpan(
                        delta,
                        state.tokens,
                        len(out.token_ids),
                        state.chars + (len(renderer.prefix) if state.started else 0),
                        out.finish_reason,
                        not state.started,
                    )
                    yield sse_event(renderer.chunk(output, out, span))
                    state.chars, state.tokens = len(out.text), len(out.token_ids)
                    state.started, state.done = True, out.finish_reason is not None
                if output.finished:
                    break
                output = await anext(rest)
                tracker.update(output)
            tracker.finish()
            if include_usage:
                yield sse_event(renderer.usage_chunk(tracker.usage()))
        except GrammarError as exc:  # the request's own constraint failed: its error alone
            error = {"message": f"Generation stopped: {exc}", "type": "invalid_request_error"}
            error |= {"param": None, "code": "constraint_failed"}
            yield f"data: {json.dumps({'error': error})}\n\n"
        except Exception as exc:  # headers are sent: report in-band
            logger.exception("request %s failed while streaming", first.request_id)
            error = {"message": f"Generation stopped: {exc}", "type": "server_error"}
            yield f"data: {json.dumps({'error': error | {'param': None, 'code': None}})}\n\n"
        finally:
            tracker.finish()
    yield "data: [DONE]\n\n"


# Characters outside ASCII that line splitters following ``str.splitlines`` (httpx's
# ``iter_lines``, so most Python clients) take as line ends, though SSE ends lines only at CR and
# LF. JSON escapes every control character below U+0020 already; these it may write raw.
_UNICODE_LINE_ENDS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse_event(model: BaseModel) -> str:
    """One server-sent event ``data: {json}\\n\\n`` of ``model``, the JSON on one line for every
    client: the Unicode line ends a model may generate (NEL, LINE and PARAGRAPH SEPARATOR) are
    written as JSON escapes, which decode to the same text."""
    return f"data: {model.model_dump_json().translate(_UNICODE_LINE_ENDS)}\n\n"
