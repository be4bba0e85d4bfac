"""What the engine returns for a request (vLLM's ``RequestOutput`` / ``CompletionOutput``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Logprob:
    """The log probability of one token at one position (vLLM's ``Logprob``).

    Attributes:
        logprob: natural log of the token's probability under the raw model output
            (``log_softmax`` of the logits, before penalties, temperature or truncation).
        rank: 1 + the number of tokens strictly more likely (rank 1 = the most likely).
        decoded_token: the token's text alone, or None when not decoded.
    """

    logprob: float
    rank: int
    decoded_token: str | None = None


#: One position's logprobs: token id -> Logprob (the chosen token and the top ones).
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One completion of a request, cumulative so far.

    Attributes:
        index: the completion's index among the request's ``n``, 0..n-1.
        text: the generated text so far; cut before a stop string (unless
            ``include_stop_str_in_output``); while unfinished, the last ``max(len(stop)) - 1``
            characters are held back when stop strings are set.
        token_ids: the generated token ids so far (including the EOS or stop token, if any).
        finish_reason: "stop" (EOS, stop token or stop string), "length" (max_tokens or the
            model's length limit), "abort", "error" (its structured-output constraint failed
            while it generated: ``error`` says why; ``text`` is not valid output), or None
            while running.
        logprobs: one dict per generated token (the sampled token plus the top
            ``params.logprobs``) when logprobs were asked for, else None.
        cumulative_logprob: sum of the sampled tokens' logprobs when logprobs were asked for,
            else None.
        stop_reason: the stop string or stop token id that ended the completion, else None.
        error: why the completion ended with finish_reason "error", else None.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    stop_reason: str | int | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request after an engine step.

    Attributes:
        request_id: the caller's id.
        prompt: the prompt text, if the caller gave text, else None.
        prompt_token_ids: the prompt's token ids.
        outputs: the request's ``n`` completions, ``outputs[i].index == i``.
        finished: whether the request has ended (every completion has a finish reason).
        prompt_logprobs: when asked for, one entry per prompt token: None for the first (nothing
            predicts it), then the prompt token's Logprob plus the top ``params.prompt_logprobs``.
        num_cached_tokens: prompt tokens whose KV came from the prefix cache.
        time_in_queue: seconds from the request's arrival to its first admission by the
            scheduler; None while it waits (or for a request aborted before it).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0
    time_in_queue: float | None = None
