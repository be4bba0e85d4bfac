"""Turn sequences into `RequestOutput`s: detokenization, stop strings, logprobs, n > 1 grouping
(vLLM v1's ``OutputProcessor``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmc.runtime.detokenizer import IncrementalDetokenizer
from llmc.runtime.logprobs import TokenLogprobs, compute_logprobs
from llmc.runtime.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from llmc.runtime.sequence import Sequence
from llmc.runtime.stop_matcher import StopMatcher


@dataclass
class _Completion:
    """One completion's text and logprobs so far."""

    seq: Sequence
    detokenizer: IncrementalDetokenizer
    logprobs: list[PositionLogprobs] | None
    cumulative_logprob: float | None


@dataclass
class _RequestState:
    """What is kept about one request besides its sequences: the automaton of its stop strings
    (shared by its completions), its completions (they grow to ``n`` at the fork) and its prompt
    logprobs so far (entry 0 is None)."""

    seq: Sequence
    stop_matcher: StopMatcher
    completions: dict[int, _Completion] = field(default_factory=dict)
    prompt_logprobs: list[PositionLogprobs | None] | None = None


class OutputProcessor:
    """Keeps the state of every unfinished request and builds its outputs.

    Args:
        tokenizer: the model's Hugging Face tokenizer (``decode`` only).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._requests: dict[str, _RequestState] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def add_request(self, seq: Sequence) -> None:
        """Track a new request; builds its stop strings' automaton (time linear in their total
        length), once for all its completions."""
        state = _RequestState(seq, StopMatcher(seq.params.stop))
        if seq.params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        self._requests[seq.request_id] = state

    def abort_request(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def record_prompt_logprobs(self, seq: Sequence, start: int, logits: np.ndarray) -> None:
        """Logprobs of prompt tokens ``start+1 .. start+R`` from the logits [R, V] of positions
        ``start .. start+R-1``; tokens already recorded (a recomputation) are skipped."""
        state = self._requests.get(seq.request_id)
        if state is None or state.prompt_logprobs is None:
            return
        targets = np.asarray(seq.prompt_token_ids[start + 1 : start + 1 + len(logits)])
        lp = compute_logprobs(logits, targets, seq.params.prompt_logprobs)
        for t, entry in enumerate(self._to_dicts(lp, targets), start + 1):
            if t == len(state.prompt_logprobs):
                state.prompt_logprobs.append(entry)

    def record_logprobs(self, seqs: list[Sequence], logits: np.ndarray, tokens: np.ndarray) -> None:
        """Logprobs of the tokens just sampled (``tokens`` [S]) from ``logits`` [S, V], for the
        sequences of ``seqs`` that asked for them."""
        rows = [i for i, seq in enumerate(seqs) if seq.params.logprobs is not None]
        if not rows:
            return
        by_k: dict[int, list[int]] = {}
        for i in rows:
            by_k.setdefault(seqs[i].params.logprobs, []).append(i)
        for num_top, group in by_k.items():
            lp = compute_logprobs(logits[group], tokens[group], num_top)
            for i, entry in zip(group, self._to_dicts(lp, tokens[group]), strict=True):
                state = self._requests.get(seqs[i].request_id)
                if state is not None:
                    completion = self._completion(state, seqs[i])
                    completion.logprobs.append(entry)
                    completion.cumulative_logprob += entry[int(tokens[i])].logprob

    def update(self, seq: Sequence) -> str | None:
        """Detokenize the sequence's new tokens (one, or several accepted speculative ones);
        returns the stop string they completed, if any. Tokens after the one that completed a
        stop string are dropped from ``seq``: its output ends there."""
        state = self._requests.get(seq.request_id)
        if state is None:
            return None
        detokenizer = self._completion(state, seq).detokenizer
        stop = None
        for i in range(detokenizer.num_output_tokens, seq.num_output_tokens):
            stop = detokenizer.update(seq.output_token_ids[i])
            if stop is not None:
                del seq.output_token_ids[i + 1 :]
                return stop
        if seq.is_finished:
            stop = detokenizer.finish()
        return stop

    def make_outputs(self, request_ids: Iterable[str]) -> list[RequestOutput]:
        """The current output of each request; finished requests are forgotten."""
        outputs = []
        for request_id in request_ids:
            state = self._requests.get(request_id)
            if state is None:
                continue
            completions = [
                self._completion_output(state.completions[i]) for i in sorted(state.completions)
            ]
            finished = len(completions) == state.seq.params.n and all(
                c.finished for c in completions
            )
            if finished:
                del self._requests[request_id]
            outputs.append(
                RequestOutput(
                    request_id=request_id,
                    prompt=state.seq.prompt,
                    prompt_token_ids=state.seq.prompt_token_ids,
                    outputs=completions,
                    finished=finished,
                    prompt_logprobs=None
                    if state.prompt_logprobs is None
                    else list(state.prompt_logprobs),
                    num_cached_tokens=state.seq.num_cached_tokens,
                    time_in_queue=_time_in_queue(state.seq),
                )
            )
        return outputs

    def _completion_output(self, c: _Completion) -> CompletionOutput:
        finished = c.seq.is_finished
        return CompletionOutput(
            index=c.seq.index,
            text=c.detokenizer.text(finished),
            token_ids=list(c.seq.output_token_ids),
            finish_reason=c.seq.finish_reason,
            logprobs=None if c.logprobs is None else list(c.logprobs),
            cumulative_logprob=c.cumulative_logprob,
            stop_reason=c.seq.stop_reason,
            error=c.seq.grammar.error if c.seq.grammar is not None else None,
        )

    def _completion(self, state: _RequestState, seq: Sequence) -> _Completion:
        completion = state.completions.get(seq.index)
        if completion is None:
            wants = seq.params.logprobs is not None
            detokenizer = IncrementalDetokenizer(
                self.tokenizer, seq.prompt_token_ids, seq.params, state.stop_matcher
            )
            completion = _Completion(
                seq, detokenizer, [] if wants else None, 0.0 if wants else None
            )
            state.completions[seq.index] = completion
        return completion

    def _to_dicts(self, lp: TokenLogprobs, tokens: np.ndarray) -> list[PositionLogprobs]:
        """One dict per row: the chosen token first, then the top tokens, most likely first."""
        entries = []
        for r, token in enumerate(tokens.tolist()):
            entry = {
                token: Logprob(
                    float(lp.token_logprobs[r]), int(lp.token_ranks[r]), self._decode(token)
                )
            }
            for rank, (t, value) in enumerate(
                zip(lp.top_ids[r].tolist(), lp.top_logprobs[r].tolist(), strict=True), 1
            ):
                if t not in entry:
                    entry[t] = Logprob(value, rank, self._decode(t))
            entries.append(entry)
        return entries

    def _decode(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def _time_in_queue(seq) -> float | None:
    """Seconds ``seq`` (a ``Sequence``) waited before its first admission; None while it
    waits."""
    if seq.first_scheduled_time is None:
        return None
    return seq.first_scheduled_time - seq.arrival_time
