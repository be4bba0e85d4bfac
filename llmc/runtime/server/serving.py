"""The two generation endpoints: request -> prompt tokens and ``SamplingParams`` -> engine ->
OpenAI response, whole or as server-sent events.

Both endpoints share one path; they differ only in how the prompt is built (raw text or token
ids vs. the tokenizer's chat template) and in the response schema. Streamed text is sent as
deltas of the engine's cumulative text. Everything that can be wrong with a request is found
before the response starts (the first engine output is awaited before the headers are sent), so
errors get a proper status; an engine failure mid-stream is reported in-band as an error event.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from llmc.runtime.outputs import RequestOutput
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.server.async_engine import AsyncLLMEngine
from llmc.runtime.server.errors import ApiError, QueueFullError, bad_request
from llmc.runtime.server.metrics import ServerMetrics
from llmc.runtime.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from llmc.runtime.server.responses import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    CompletionChoice,
    CompletionResponse,
    DeltaMessage,
    UsageInfo,
)

logger = logging.getLogger(__name__)

# Builds one streamed event from (text delta, finish reason, usage); a None delta makes the
# usage-only chunk (no choices).
ChunkFactory = Callable[[str | None, str | None, UsageInfo | None], BaseModel]


class OpenAIServing:
    """Serves ``/v1/completions`` and ``/v1/chat/completions`` for one model.

    Args:
        engine: the running async engine.
        model_name: the only value of ``model`` the server accepts (else 404).
        metrics: where request statistics go.
        retry_after_s: the ``Retry-After`` sent with 503 when the queue is full, seconds.
    """

    def __init__(
        self,
        engine: AsyncLLMEngine,
        model_name: str,
        metrics: ServerMetrics,
        retry_after_s: int = 1,
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.metrics = metrics
        self.retry_after_s = retry_after_s

    async def completion(self, request: CompletionRequest) -> JSONResponse | StreamingResponse:
        """``POST /v1/completions``."""
        self._check_model(request.model)
        prompt = request.prompt
        if isinstance(prompt, str):
            prompt_ids, text = self.engine.tokenizer.encode(prompt), prompt
        else:
            prompt_ids, text = list(prompt), None  # the engine checks the vocabulary range
        rid = f"cmpl-{uuid.uuid4().hex}"

        def chunk(delta: str | None, finish: str | None, usage: UsageInfo | None) -> BaseModel:
            choices = [] if delta is None else [CompletionChoice(text=delta, finish_reason=finish)]
            return CompletionResponse(id=rid, model=self.model_name, choices=choices, usage=usage)

        def whole(text: str, finish: str | None, usage: UsageInfo) -> BaseModel:
            choice = CompletionChoice(text=text, finish_reason=finish)
            return CompletionResponse(id=rid, model=self.model_name, choices=[choice], usage=usage)

        return await self._serve(request, rid, prompt_ids, text, request.max_tokens, chunk, whole)

    async def chat(self, request: ChatCompletionRequest) -> JSONResponse | StreamingResponse:
        """``POST /v1/chat/completions``: the prompt is the tokenizer's chat template applied
        to ``messages`` with ``add_generation_prompt=True``."""
        self._check_model(request.model)
        text = self._render_chat(request)
        # The template already holds every special token (BOS included, if the model uses one).
        prompt_ids = self.engine.tokenizer.encode(text, add_special_tokens=False)
        rid = f"chatcmpl-{uuid.uuid4().hex}"

        def chunk(delta: str | None, finish: str | None, usage: UsageInfo | None) -> BaseModel:
            choices = []
            if delta is not None:
                opening = delta == "" and finish is None  # the first chunk: it names the role
                msg = DeltaMessage(
                    role="assistant" if opening else None,
                    content=(delta or None) if finish else delta,
                )
                choices = [ChatCompletionStreamChoice(delta=msg, finish_reason=finish)]
            return ChatCompletionChunk(id=rid, model=self.model_name, choices=choices, usage=usage)

        def whole(text: str, finish: str | None, usage: UsageInfo) -> BaseModel:
            choice = ChatCompletionChoice(
                message=AssistantMessage(content=text), finish_reason=finish
            )
            return ChatCompletionResponse(
                id=rid, model=self.model_name, choices=[choice], usage=usage
            )

        return await self._serve(
            request, rid, prompt_ids, text, request.max_new_tokens, chunk, whole
        )

    async def _serve(
        self,
        request: SamplingFields,
        request_id: str,
        prompt_ids: list[int],
        prompt: str | None,
        max_tokens: int | None,
        chunk: ChunkFactory,
        whole: Callable[[str, str | None, UsageInfo], BaseModel],
    ) -> JSONResponse | StreamingResponse:
        """Submit the request, wait for its first output, then answer whole or streamed."""
        arrival = time.monotonic()
        params = self._sampling_params(request, len(prompt_ids), max_tokens)
        outputs = self.engine.generate(prompt_ids, params, request_id, prompt=prompt)
        try:
            first = await anext(outputs)
        except QueueFullError as exc:
            headers = {"Retry-After": str(self.retry_after_s)}
            raise ApiError(
                503, str(exc), "server_error", code="server_overloaded", headers=headers
            ) from exc
        except ValueError as exc:  # LLMEngine.add_request refused the prompt or the parameters
            raise bad_request(str(exc)) from exc
        self.metrics.observe_first_token(time.monotonic() - arrival)

        def finished(final: RequestOutput) -> tuple[str, str, UsageInfo]:
            out = final.outputs[0]
            finish = out.finish_reason or "stop"
            usage = UsageInfo.of(len(prompt_ids), len(out.token_ids))
            self.metrics.observe_finished(
                len(prompt_ids), len(out.token_ids), finish, time.monotonic() - arrival
            )
            return out.text, finish, usage

        if not request.stream:
            async with aclosing(outputs):
                final = first
                async for final in outputs:  # noqa: B007 - only the last (cumulative) one counts
                    pass
            text, finish, usage = finished(final)
            return JSONResponse(whole(text, finish, usage).model_dump(mode="json"))
        opening = isinstance(request, ChatCompletionRequest)
        events = _sse(first, outputs, chunk, finished, request.include_usage, opening)
        return StreamingResponse(events, media_type="text/event-stream")

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise ApiError(
                404,
                f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                param="model",
                code="model_not_found",
            )

    def _render_chat(self, request: ChatCompletionRequest) -> str:
        try:
            messages = [{"role": m.role, "content": m.text()} for m in request.messages]
            return self.engine.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # jinja2.TemplateError, ValueError: the messages do not fit
            raise bad_request(f"Cannot apply the chat template: {exc}", "messages") from exc

    def _sampling_params(
        self, request: SamplingFields, num_prompt_tokens: int, max_tokens: int | None
    ) -> SamplingParams:
        """The request's ``SamplingParams``; 400 when the prompt plus ``max_tokens`` does not
        fit the model's context (``max_tokens=None``: the rest of the context)."""
        limit = self.engine.max_model_len
        param = "messages" if isinstance(request, ChatCompletionRequest) else "prompt"
        if num_prompt_tokens == 0:
            raise bad_request("The prompt is empty: it must have at least one token.", param)
        if max_tokens is None:
            max_tokens = max(limit - num_prompt_tokens, 1)
        if num_prompt_tokens + max_tokens > limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the {param}, "
                f"{max_tokens} for the completion). Please reduce the length of the {param} or "
                "max_tokens.",
                param,
                "context_length_exceeded",
            )
        params = SamplingParams(
            n=1,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k,
            seed=request.seed,
            max_tokens=max_tokens,
            stop=request.stop_list,
            stop_token_ids=list(request.stop_token_ids or []),
            ignore_eos=request.ignore_eos,
        )
        try:
            params.validate()
        except ValueError as exc:
            raise bad_request(str(exc)) from exc
        return params


async def _sse(
    first: RequestOutput,
    rest: AsyncIterator[RequestOutput],
    chunk: ChunkFactory,
    finished: Callable[[RequestOutput], tuple[str, str, UsageInfo]],
    include_usage: bool,
    opening: bool,
) -> AsyncIterator[str]:
    """Server-sent events: an opening empty chunk if ``opening`` (chat: it carries the role),
    ``data: {chunk}`` per text delta, the usage chunk if asked for, then ``data: [DONE]``.
    Deltas are cut from the cumulative text the engine returns."""
    async with aclosing(rest):
        if opening:
            yield _event(chunk("", None, None))
        sent, output = 0, first
        try:
            while True:
                text = output.outputs[0].text
                delta, sent = text[sent:], len(text)
                if output.finished:
                    _, finish, usage = finished(output)
                    yield _event(chunk(delta, finish, None))
                    if include_usage:
                        yield _event(chunk(None, None, usage))
                    break
                if delta:
                    yield _event(chunk(delta, None, None))
                output = await anext(rest)
        except Exception as exc:  # headers are sent: report in-band, as vLLM does
            logger.exception("request %s failed while streaming", first.request_id)
            error = {"message": f"Generation stopped: {exc}", "type": "server_error"}
            yield f"data: {json.dumps({'error': error | {'param': None, 'code': None}})}\n\n"
    yield "data: [DONE]\n\n"


def _event(model: BaseModel) -> str:
    return f"data: {model.model_dump_json()}\n\n"
