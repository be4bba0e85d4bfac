"""What the engine returns for a request (vLLM's ``RequestOutput`` / ``CompletionOutput``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CompletionOutput:
    """One completion of a request, cumulative so far.

    Attributes:
        index: the completion's index among the request's ``n`` (always 0 today).
        text: the generated text so far; cut before a stop string; while unfinished, the last
            ``max(len(stop)) - 1`` characters are held back when stop strings are set.
        token_ids: the generated token ids so far (including the EOS or stop token, if any).
        finish_reason: "stop" (EOS, stop token or stop string), "length" (max_tokens or the
            model's length limit), "abort", or None while running.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None

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
        outputs: the request's completions (one today).
        finished: whether the request has ended (every completion has a finish reason).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
