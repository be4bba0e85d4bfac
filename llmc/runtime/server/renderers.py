"""Engine outputs rendered as OpenAI responses: whole (non-streamed) or one chunk per update of
one choice (streamed). One renderer per endpoint and request; ``streaming.py`` decides when a
chunk is due, a renderer only shapes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel

from llmc.runtime.outputs import CompletionOutput, RequestOutput
from llmc.runtime.server.logprobs import TokenTexts, chat_logprobs, completion_logprobs
from llmc.runtime.server.responses import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    DeltaMessage,
    UsageInfo,
)
from llmc.runtime.server.tool_format import ToolFormat
from llmc.runtime.server.tool_protocol import FunctionCallDelta, ToolCallDelta


@dataclass(frozen=True)
class ChunkSpan:
    """What one streamed chunk of a choice carries.

    Attributes:
        text: the new text of the choice (the echoed prompt first, when echoing).
        start, end: the new tokens, ``output.token_ids[start:end]``.
        text_offset: characters of the choice sent before this chunk.
        finish_reason: set on the choice's last chunk.
        first: whether this is the choice's first chunk.
    """

    text: str
    start: int
    end: int
    text_offset: int
    finish_reason: str | None
    first: bool


class Renderer(Protocol):
    """Shapes one request's responses."""

    request_id: str
    prefix: str  # text put before every choice's output (the echoed prompt), else ""
    buffered: bool  # a choice streams as one chunk when it ends (its text is parsed whole)

    def response(self, final: RequestOutput, usage: UsageInfo) -> BaseModel: ...

    def opening(self, index: int) -> BaseModel | None: ...

    def chunk(
        self, request: RequestOutput, output: CompletionOutput, span: ChunkSpan
    ) -> BaseModel: ...

    def usage_chunk(self, usage: UsageInfo) -> BaseModel: ...


@dataclass
class CompletionRenderer:
    """``/v1/completions``: ``text_completion`` objects, legacy log-probs, optional echo.

    Attributes:
        request_id, model: of every response.
        texts: token texts for log-probs.
        logprobs: alternatives per token, or None for no log-probs.
        prefix: the echoed prompt text, or "".
        prompt_token_ids: the prompt (for echoed log-probs).
    """

    request_id: str
    model: str
    texts: TokenTexts
    logprobs: int | None = None
    prefix: str = ""
    prompt_token_ids: list[int] = field(default_factory=list)
    buffered: bool = False

    def response(self, final: RequestOutput, usage: UsageInfo) -> BaseModel:
        choices = []
        for out in final.outputs:
            span = ChunkSpan(out.text, 0, len(out.token_ids), 0, out.finish_reason, True)
            choices.append(self._choice(final, out, span))
        return CompletionResponse(
            id=self.request_id, model=self.model, choices=choices, usage=usage
        )

    def opening(self, index: int) -> BaseModel | None:
        return None

    def chunk(self, request: RequestOutput, output: CompletionOutput, span: ChunkSpan) -> BaseModel:
        choice = self._choice(request, output, span)
        return CompletionResponse(id=self.request_id, model=self.model, choices=[choice])

    def usage_chunk(self, usage: UsageInfo) -> BaseModel:
        return CompletionResponse(id=self.request_id, model=self.model, choices=[], usage=usage)

    def _choice(
        self, request: RequestOutput, out: CompletionOutput, span: ChunkSpan
    ) -> CompletionChoice:
        echo = self.prefix if span.first else ""
        logprobs = None
        if self.logprobs is not None and out.logprobs is not None:
            logprobs = CompletionLogprobs()
            offset = span.text_offset
            if echo:
                positions = request.prompt_logprobs or [None] * len(self.prompt_token_ids)
                logprobs = completion_logprobs(
                    self.prompt_token_ids, positions, self.logprobs, self.texts, offset
                )
                offset += len(echo)
            generated = completion_logprobs(
                out.token_ids[span.start : span.end],
                out.logprobs[span.start : span.end],
                self.logprobs,
                self.texts,
                offset,
            )
            for name in ("text_offset", "token_logprobs", "tokens", "top_logprobs"):
                getattr(logprobs, name).extend(getattr(generated, name))
        return CompletionChoice(
            index=out.index,
            text=echo + span.text,
            logprobs=logprobs,
            finish_reason=span.finish_reason,
        )


@dataclass
class ChatRenderer:
    """``/v1/chat/completions``: ``chat.completion`` and ``chat.completion.chunk`` objects.

    Attributes:
        request_id, model: of every response.
        texts: token texts for log-probs.
        logprobs: alternatives per token (``top_logprobs``), or None for no log-probs.
        tool_format: set when the model may call tools: its answer, in this format
            (``tool_format.py``), is parsed into content and ``tool_calls``, and streamed as
            one chunk per choice when the choice ends.
    """

    request_id: str
    model: str
    texts: TokenTexts
    logprobs: int | None = None
    prefix: str = ""
    tool_format: ToolFormat | None = None

    @property
    def buffered(self) -> bool:
        return self.tool_format is not None

    def response(self, final: RequestOutput, usage: UsageInfo) -> BaseModel:
        choices = []
        for out in final.outputs:
            message, finish_reason = self._message(out)
            choices.append(
                ChatCompletionChoice(
                    index=out.index,
                    message=message,
                    logprobs=self._logprobs(out, 0, len(out.token_ids)),
                    finish_reason=finish_reason,
                )
            )
        return ChatCompletionResponse(
            id=self.request_id, model=self.model, choices=choices, usage=usage
        )

    def opening(self, index: int) -> BaseModel | None:
        """The first chunk of a choice names the role (and has empty content), as OpenAI's."""
        delta = DeltaMessage(role="assistant", content="")
        return self._chunk([ChatCompletionStreamChoice(index=index, delta=delta)])

    def chunk(self, request: RequestOutput, output: CompletionOutput, span: ChunkSpan) -> BaseModel:
        finish_reason = span.finish_reason
        if (
            self.tool_format is not None
        ):  # the whole answer, parsed: content or the calls, one delta each
            message, finish_reason = self._message(output)
            calls = [
                ToolCallDelta(
                    index=i,
                    id=c.id,
                    type="function",
                    function=FunctionCallDelta(
                        name=c.function.name, arguments=c.function.arguments
                    ),
                )
                for i, c in enumerate(message.tool_calls or [])
            ]
            delta = DeltaMessage(content=message.content, tool_calls=calls or None)
        else:
            content = (span.text or None) if span.finish_reason else span.text
            delta = DeltaMessage(content=content)
        choice = ChatCompletionStreamChoice(
            index=output.index,
            delta=delta,
            logprobs=self._logprobs(output, span.start, span.end),
            finish_reason=finish_reason,
        )
        return self._chunk([choice])

    def _message(self, out: CompletionOutput) -> tuple[AssistantMessage, str | None]:
        """The choice's message and finish reason: with tools, the parsed answer, whose calls
        finish with ``tool_calls``."""
        if self.tool_format is None:
            return AssistantMessage(content=out.text), out.finish_reason
        answer = self.tool_format.parse(out.text)
        if answer.calls and out.finish_reason == "stop":
            message = AssistantMessage(content=answer.content, tool_calls=list(answer.calls))
            return message, "tool_calls"
        return AssistantMessage(content=answer.content), out.finish_reason

    def usage_chunk(self, usage: UsageInfo) -> BaseModel:
        return ChatCompletionChunk(id=self.request_id, model=self.model, choices=[], usage=usage)

    def _chunk(self, choices: list[ChatCompletionStreamChoice]) -> BaseModel:
        return ChatCompletionChunk(id=self.request_id, model=self.model, choices=choices)

    def _logprobs(self, out: CompletionOutput, start: int, end: int) -> ChatLogprobs | None:
        if self.logprobs is None or out.logprobs is None:
            return None
        return chat_logprobs(
            out.token_ids[start:end], out.logprobs[start:end], self.logprobs, self.texts
        )
