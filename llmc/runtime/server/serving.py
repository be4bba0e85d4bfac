"""The two generation endpoints: request -> prompt tokens and ``SamplingParams`` -> engine ->
OpenAI response, whole or as server-sent events.

Both endpoints share one path; they differ only in how the prompt is built (raw text or token
ids vs. the tokenizer's chat template) and in the response schema (``renderers.py``).
Everything that can be wrong with a request is found before the response starts (the first
engine output is awaited before the headers are sent), so errors get a proper status.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import aclosing

from fastapi.responses import JSONResponse, StreamingResponse

from llmc.errors import ContextLengthError
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.server.async_engine import AsyncLLMEngine
from llmc.runtime.server.errors import ApiError, QueueFullError, bad_request
from llmc.runtime.server.logprobs import TokenTexts
from llmc.runtime.server.metrics import ServerMetrics
from llmc.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from llmc.runtime.server.renderers import ChatRenderer, CompletionRenderer, Renderer
from llmc.runtime.server.streaming import RequestTracker, sse_events

logger = logging.getLogger(__name__)

Request = CompletionRequest | ChatCompletionRequest


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
        self._texts = TokenTexts(engine.tokenizer)
        self._ids = TokenTexts(engine.tokenizer, as_ids=True)

    async def completion(self, request: CompletionRequest) -> JSONResponse | StreamingResponse:
        """``POST /v1/completions``."""
        self._check_model(request.model)
        prompt = request.prompt
        if isinstance(prompt, str):
            prompt_ids, text = self.engine.tokenizer.encode(prompt), prompt
        else:
            prompt_ids, text = list(prompt), None  # the engine checks the vocabulary range
        prefix = ""
        if request.echo:
            prefix = text if text is not None else self.engine.tokenizer.decode(prompt_ids)
        renderer = CompletionRenderer(
            f"cmpl-{uuid.uuid4().hex}",
            self.model_name,
            self._ids if request.return_tokens_as_token_ids else self._texts,
            logprobs=request.logprobs,
            prefix=prefix,
            prompt_token_ids=prompt_ids,
        )
        return await self._serve(request, renderer, prompt_ids, text, "prompt")

    async def chat(self, request: ChatCompletionRequest) -> JSONResponse | StreamingResponse:
        """``POST /v1/chat/completions``: the prompt is the tokenizer's chat template applied
        to ``messages`` with ``add_generation_prompt=True``."""
        self._check_model(request.model)
        text = self._render_chat(request)
        # The template already holds every special token (BOS included, if the model uses one).
        prompt_ids = self.engine.tokenizer.encode(text, add_special_tokens=False)
        renderer = ChatRenderer(
            f"chatcmpl-{uuid.uuid4().hex}",
            self.model_name,
            self._ids if request.return_tokens_as_token_ids else self._texts,
            logprobs=request.sampled_logprobs,
        )
        return await self._serve(request, renderer, prompt_ids, text, "messages")

    async def _serve(
        self,
        request: Request,
        renderer: Renderer,
        prompt_ids: list[int],
        prompt: str | None,
        param: str,
    ) -> JSONResponse | StreamingResponse:
        """Submit the request, wait for its first output, then answer whole or streamed."""
        arrival = time.monotonic()
        params = self._sampling_params(request, len(prompt_ids), param)
        request_id = renderer.request_id
        outputs = self.engine.generate(prompt_ids, params, request_id, prompt=prompt)
        try:
            first = await anext(outputs)
        except QueueFullError as exc:
            headers = {"Retry-After": str(self.retry_after_s)}
            raise ApiError(
                503, str(exc), "server_error", code="server_overloaded", headers=headers
            ) from exc
        except ContextLengthError as exc:
            raise _context_length_error(exc, len(prompt_ids), params.max_tokens, param) from exc
        except ValueError as exc:  # LLMEngine.add_request refused the prompt or the parameters
            raise bad_request(str(exc)) from exc
        tracker = RequestTracker(self.metrics, len(prompt_ids), arrival)
        tracker.update(first)
        if not request.stream:
            try:
                async with aclosing(outputs):
                    async for output in outputs:
                        tracker.update(output)
            finally:
                tracker.finish()
            response = renderer.response(tracker.last or first, tracker.usage())
            return JSONResponse(response.model_dump(mode="json"))
        events = sse_events(first, outputs, renderer, tracker, params.n, request.include_usage)
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
        self, request: Request, num_prompt_tokens: int, param: str
    ) -> SamplingParams:
        """The request's ``SamplingParams`` (OpenAI's and vLLM's fields, vLLM's defaults);
        ``max_tokens`` unset means the rest of the context. 400 for an empty prompt or values
        ``SamplingParams.validate`` refuses."""
        if num_prompt_tokens == 0:
            raise bad_request("The prompt is empty: it must have at least one token.", param)
        max_tokens = request.max_new_tokens
        if max_tokens is None:
            max_tokens = max(self.engine.max_model_len - num_prompt_tokens, 1)
        params = SamplingParams(
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
        )
        try:
            params.validate()
        except ValueError as exc:
            name = str(exc).split(" ", 1)[0]
            param = name if name in type(request).model_fields else None
            raise bad_request(str(exc), param) from exc
        return params


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
