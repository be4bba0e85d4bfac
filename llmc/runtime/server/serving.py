"""The two generation endpoints: request -> prompt tokens and ``SamplingParams`` -> engine ->
OpenAI response, whole or as server-sent events.

Both endpoints share one path; they differ only in how the prompt is built (raw text or token
ids vs. the tokenizer's chat template) and in the response schema (``renderers.py``).
Everything that can be wrong with a request is found before the response starts (the first
engine output is awaited before the headers are sent), so errors get a proper status.

Tokenization and chat templating run on one worker thread, off the event loop: a 4 MiB prompt
takes seconds to tokenize, and meanwhile ``/health`` and every other request must be answered.
One worker, as vLLM's tokenizer executor: a Hugging Face tokenizer must not be reconfigured
while another thread uses it, and a flood of huge prompts then holds one core, not all of
them. A request whose client has gone before its turn is dropped from the queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import TypeVar

from fastapi.responses import JSONResponse, StreamingResponse

from llmc.errors import ContextLengthError
from llmc.runtime.chat_template import CHAT_ADD_SPECIAL_TOKENS, ChatTemplateError, render_chat
from llmc.runtime.errors import InvalidRequestError
from llmc.runtime.lora.lora_request import LoRARequest
from llmc.runtime.request_check import check_vocabulary
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.server.bounded_encode import encode_bounded
from llmc.runtime.server.chat_messages import ChatMessage, template_messages
from llmc.runtime.server.engine_client import EngineClient
from llmc.runtime.server.errors import ApiError, QueueFullError, bad_request
from llmc.runtime.server.limits import RequestLimits
from llmc.runtime.server.logprobs import TokenTexts
from llmc.runtime.server.metrics import ServerMetrics
from llmc.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from llmc.runtime.server.renderers import ChatRenderer, CompletionRenderer, Renderer
from llmc.runtime.server.streaming import RequestTracker, sse_events
from llmc.runtime.server.tokenize_protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from llmc.runtime.server.tool_format import detect_tool_format
from llmc.runtime.server.tracing import RequestSpan, RequestTracing
from llmc.runtime.structured.grammar import GrammarError
from llmc.runtime.structured.structured_outputs import FIELD as STRUCTURED_FIELD

logger = logging.getLogger(__name__)

Request = CompletionRequest | ChatCompletionRequest
T = TypeVar("T")


class OpenAIServing:
    """Serves ``/v1/completions`` and ``/v1/chat/completions`` for one model.

    Args:
        engine: the running async engine.
        model_name: the only value of ``model`` the server accepts (else 404).
        metrics: where request statistics go.
        limits: the bounds every request is checked against (400 past one).
        retry_after_s: the ``Retry-After`` sent with 503 when the queue is full, seconds.
        tracing: opens each request's span (``tracing.RequestTracing``); None: no tracing.

    Attributes:
        tool_format: how the model writes tool calls, read from its chat template
            (``tool_format.detect_tool_format``).
    """

    def __init__(
        self,
        engine: EngineClient,
        model_name: str,
        metrics: ServerMetrics,
        limits: RequestLimits,
        retry_after_s: int = 1,
        tracing: RequestTracing | None = None,
    ) -> None:
        self.engine = engine
        self.tracing = tracing
        self.model_name = model_name
        self.metrics = metrics
        self.limits = limits
        self.retry_after_s = retry_after_s
        self.tool_format = detect_tool_format(getattr(engine.tokenizer, "chat_template", None))
        self._texts = TokenTexts(engine.tokenizer)
        self._ids = TokenTexts(engine.tokenizer, as_ids=True)
        self._tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmc-tokenize")

    def close(self) -> None:
        """Stop the tokenizer thread once it is idle; queued work is dropped."""
        self._tokenizing.shutdown(wait=False, cancel_futures=True)

    async def completion(
        self, request: CompletionRequest, headers: Mapping[str, str] | None = None
    ) -> JSONResponse | StreamingResponse:
        """``POST /v1/completions``; ``headers``: the HTTP request's (a ``traceparent``)."""
        lora = self._check(request)
        prompt, tokenizer = request.prompt, self.engine.tokenizer
        if isinstance(prompt, str):
            prompt_ids, text = await self._encode_off_loop(prompt, True, "prompt"), prompt
        else:
            prompt_ids, text = list(prompt), None
            if request.echo:  # decoded for the echo before the engine checks them
                self._check_vocabulary("prompt", prompt_ids)
        prefix = ""
        if request.echo and text is not None:
            prefix = text
        elif request.echo:
            prefix = await self._off_loop(tokenizer.decode, prompt_ids)
        renderer = CompletionRenderer(
            f"cmpl-{uuid.uuid4().hex}",
            request.model,
            self._ids if request.return_tokens_as_token_ids else self._texts,
            logprobs=request.logprobs,
            prefix=prefix,
            prompt_token_ids=prompt_ids,
        )
        trace = ("completion", headers or {})
        return await self._serve(request, renderer, prompt_ids, text, ("prompt", lora), trace)

    async def chat(
        self, request: ChatCompletionRequest, headers: Mapping[str, str] | None = None
    ) -> JSONResponse | StreamingResponse:
        """``POST /v1/chat/completions``: the prompt is the tokenizer's chat template applied
        to ``messages`` with ``add_generation_prompt=True``; ``headers`` as ``completion``'s."""
        lora = self._check(request)
        text = await self._off_loop(self._render_chat, request)
        prompt_ids = await self._encode_off_loop(text, CHAT_ADD_SPECIAL_TOKENS, "messages")
        renderer = ChatRenderer(
            f"chatcmpl-{uuid.uuid4().hex}",
            request.model,
            self._ids if request.return_tokens_as_token_ids else self._texts,
            logprobs=request.sampled_logprobs,
            tool_format=self.tool_format if request.tool_plan is not None else None,
        )
        trace = ("chat", headers or {})
        return await self._serve(request, renderer, prompt_ids, text, ("messages", lora), trace)

    async def _serve(
        self,
        request: Request,
        renderer: Renderer,
        prompt_ids: list[int],
        prompt: str | None,
        source: tuple[str, LoRARequest | None],
        trace: tuple[str, Mapping[str, str]],
    ) -> JSONResponse | StreamingResponse:
        """Submit the request, wait for its first output, then answer whole or streamed.
        ``source``: (the prompt's field name, the LoRA adapter serving it or None);
        ``trace``: (route, HTTP headers) of its span."""
        param, lora = source
        arrival = time.monotonic()
        params = self._sampling_params(request, len(prompt_ids))
        span = None
        if self.tracing is not None:
            route, headers = trace
            span = self.tracing.start(headers, route, request.model, renderer.request_id, params)
        submission = (request, renderer, prompt_ids, prompt, source, params, arrival)
        try:
            return await self._answer(submission, span)
        except BaseException as exc:
            if span is not None:
                span.fail(exc)
            raise

    async def _answer(
        self, submission: tuple, span: RequestSpan | None
    ) -> JSONResponse | StreamingResponse:
        """``_serve`` once its span is open: ``submission`` is (request, renderer, prompt ids,
        prompt text, (the prompt's field name, its LoRA adapter), sampling params, arrival
        time)."""
        request, renderer, prompt_ids, prompt, (param, lora), params, arrival = submission
        constraint_field = request.constraint[1]
        if params.structured_outputs is not None:  # its form, then its size, then compiled
            try:
                params.structured_outputs.validate()
            except InvalidRequestError as exc:
                raise _invalid_request(exc, request, param) from exc
            self.limits.check_constraint(params.structured_outputs, constraint_field)
        request_id = renderer.request_id
        outputs = self.engine.generate(prompt_ids, params, request_id, prompt, lora)
        try:
            first = await anext(outputs)
        except QueueFullError as exc:
            headers = {"Retry-After": str(self.retry_after_s)}
            raise ApiError(
                503, str(exc), "server_error", code="server_overloaded", headers=headers
            ) from exc
        except ContextLengthError as exc:
            raise _context_length_error(exc, len(prompt_ids), params.max_tokens, param) from exc
        except InvalidRequestError as exc:  # check_request or the constraint's compile refused it
            raise _invalid_request(exc, request, param) from exc
        except GrammarError as exc:  # the constraint failed at the first token
            raise bad_request(str(exc), constraint_field, "constraint_failed") from exc
        except ValueError as exc:  # a request id already in use
            raise bad_request(str(exc)) from exc
        tracker = RequestTracker(self.metrics, len(prompt_ids), arrival, span)
        tracker.update(first)
        if not request.stream:
            try:
                async with aclosing(outputs):
                    async for output in outputs:
                        tracker.update(output)
            except GrammarError as exc:  # the request's own constraint failed: its 400 alone
                raise bad_request(str(exc), constraint_field, "constraint_failed") from exc
            finally:
                tracker.finish()
            response = renderer.response(tracker.last or first, tracker.usage())
            return JSONResponse(response.model_dump(mode="json"))
        events = sse_events(first, outputs, renderer, tracker, params.n, request.include_usage)
        return StreamingResponse(events, media_type="text/event-stream")

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        """``POST /tokenize`` (vLLM's): the prompt's token ids as ``/v1/completions`` encodes
        it, or the conversation's as ``/v1/chat/completions`` does, by the same bounded
        encoding on the tokenizer thread (`encode_bounded`): a text certainly longer than the
        model's context gets the same 400 ``context_length_exceeded`` after a prefix of it is
        encoded, not the whole. 404 for another model; 400 when the chat template refuses the
        messages."""
        if request.model is not None:
            self._check_model(request.model)
        if isinstance(request, TokenizeChatRequest):
            text = await self._off_loop(
                self._render_chat_messages, request.messages, request.add_generation_prompt
            )
            param = "messages"
        else:
            text, param = request.prompt, "prompt"
        ids = await self._encode_off_loop(text, request.add_special_tokens, param)
        strs = None
        if request.return_token_strs:
            strs = await self._off_loop(self.engine.tokenizer.convert_ids_to_tokens, ids)
        return TokenizeResponse(
            count=len(ids), max_model_len=self.engine.max_model_len, tokens=ids, token_strs=strs
        )

    async def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        """``POST /detokenize`` (vLLM's): the text of ``tokens``, decoded on the tokenizer
        thread. 404 for another model; 400 naming ``tokens`` for an id outside the vocabulary
        or more than twice ``max_model_len`` ids (no model output is that long)."""
        if request.model is not None:
            self._check_model(request.model)
        self._check_vocabulary("tokens", request.tokens)
        limit = 2 * self.engine.max_model_len  # as `encode_bounded`'s refusal
        if len(request.tokens) > limit:
            raise bad_request(
                f"This model's maximum context length is {self.engine.max_model_len} tokens; "
                f"{len(request.tokens)} tokens are more than twice that.",
                "tokens",
                "context_length_exceeded",
            )
        return DetokenizeResponse(
            prompt=await self._off_loop(self.engine.tokenizer.decode, request.tokens)
        )

    def _check(self, request: Request) -> LoRARequest | None:
        """The LoRA adapter ``model`` names (None: the served model); 404 for another model;
        400 past a limit of this server (`RequestLimits.check`), before any tokenizing.
        Whether the engine can run the request is its own check (`check_request`), when the
        request reaches it."""
        lora = self._check_model(request.model)
        self.limits.check(request)
        return lora

    def _check_vocabulary(self, param: str, token_ids: list[int]) -> None:
        """400 naming ``param`` for a token id outside the vocabulary (before it is decoded:
        the tokenizer overflows on ids past 2**32 - 1)."""
        try:
            check_vocabulary(param, token_ids, self.engine.vocab_size)
        except InvalidRequestError as exc:
            raise bad_request(str(exc), param) from exc

    def _check_model(self, model: str) -> LoRARequest | None:
        """The LoRA adapter named ``model``, None for the served model's name; 404 for any
        other name."""
        if model == self.model_name:
            return None
        lora = self.engine.lora_request(model)
        if lora is None:
            served = ", ".join(f"`{n}`" for n in [self.model_name, *self.lora_names()])
            raise ApiError(
                404,
                f"The model `{model}` does not exist; this server serves {served}.",
                param="model",
                code="model_not_found",
            )
        return lora

    def lora_names(self) -> list[str]:
        """The names of the loaded LoRA adapters (each a ``model`` requests may give)."""
        return [r.lora_name for r in self.engine.loras]

    async def _off_loop(self, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` on the tokenizer thread; cancelled with the request."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizing, work, *args)

    async def _encode_off_loop(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        """``text``'s token ids, encoded on the tokenizer thread in pieces (`encode_bounded`);
        400 ``context_length_exceeded`` as soon as the pieces prove it longer than the model."""
        tokenizer = self.engine.tokenizer

        def encode() -> list[int]:
            return encode_bounded(
                lambda t: tokenizer.encode(t, add_special_tokens=add_special_tokens),
                lambda t: len(tokenizer.encode(t, add_special_tokens=False)),
                text,
                self.engine.max_model_len,
            )

        try:
            return await self._off_loop(encode)
        except ContextLengthError as exc:
            raise bad_request(str(exc), param, "context_length_exceeded") from exc

    def _render_chat(self, request: ChatCompletionRequest) -> str:
        """The chat template applied to the messages, with the tools' instructions when the
        model may call them (on the tokenizer thread); 400 naming ``messages`` when the
        template refuses them."""
        plan, fmt = request.tool_plan, self.tool_format
        if plan is None:
            return self._render_chat_messages(request.messages)
        return self._render_chat_messages(
            request.messages, instructions=fmt.instructions(plan), tools=fmt.template_tools(plan)
        )

    def _render_chat_messages(
        self,
        messages: list[ChatMessage],
        add_generation_prompt: bool = True,
        instructions: str | None = None,
        tools: list[dict] | None = None,
    ) -> str:
        """The chat template applied (native tool messages when the template renders tools
        itself); 400 naming ``messages`` when the template refuses them."""
        try:
            return render_chat(
                self.engine.tokenizer,
                template_messages(messages, instructions, native=self.tool_format.native),
                add_generation_prompt,
                tools,
            )
        except ChatTemplateError as exc:
            raise bad_request(str(exc), "messages") from exc

    def _sampling_params(self, request: Request, num_prompt_tokens: int) -> SamplingParams:
        """The request's ``SamplingParams`` (OpenAI's and vLLM's fields, vLLM's defaults);
        ``max_tokens`` unset means the rest of the context. Not checked: the engine checks
        every request (`check_request`)."""
        max_tokens = request.max_new_tokens
        if max_tokens is None:
            max_tokens = max(self.engine.max_model_len - num_prompt_tokens, 1)
        structured_outputs, field = request.constraint
        if field == "tools":
            structured_outputs = self.tool_format.constraint(request.tool_plan)
        return SamplingParams(
            n=request.n,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k,
            min_p=request.min_p or 0.0,
            seed=request.seed,
            max_tokens=max_tokens,
            min_tokens=request.min_tokens,
            stop=request.stop_list,
            stop_token_ids=list(request.stop_token_ids or []),
            include_stop_str_in_output=request.include_stop_str_in_output,
            ignore_eos=request.ignore_eos,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            repetition_penalty=(
                1.0 if request.repetition_penalty is None else request.repetition_penalty
            ),
            logprobs=request.sampled_logprobs,
            prompt_logprobs=request.prompt_logprobs,
            skip_special_tokens=request.skip_special_tokens,
            structured_outputs=structured_outputs,
        )


def _invalid_request(exc: InvalidRequestError, request: Request, param: str) -> ApiError:
    """OpenAI's 400 for a request `check_request` refused, naming the request field at fault:
    ``param`` (``prompt`` or ``messages``) for the prompt, else the `SamplingParams` field of
    the same name when the endpoint has one (a constraint's: the field that set it)."""
    field = param if exc.field == "prompt" else exc.field
    if field == STRUCTURED_FIELD:  # the constraint came from this field of the request
        field = request.constraint[1]
    return bad_request(str(exc), field if field in type(request).model_fields else None)


def _context_length_error(
    exc: ContextLengthError, num_prompt_tokens: int, max_tokens: int, param: str
) -> ApiError:
    """OpenAI's 400 for a request longer than the model's context, stating the limit."""
    return bad_request(
        f"This model's maximum context length is {exc.limit} tokens. However, you requested "
        f"{exc.num_tokens} tokens ({num_prompt_tokens} in the {param}, {max_tokens} for the "
        f"completion). Please reduce the length of the {param} or max_tokens.",
        param,
        "context_length_exceeded",
    )
