"""When a completion stops. The rules on token ids are here; the stop-string search, which needs
the detokenized text, is the detokenizer's; nothing else decides a stop.

A completion stops for reasons of two kinds, decided at two points of a step because they need
different inputs (vLLM v1 splits them the same way: ``check_stop`` in the scheduler, stop
strings in the detokenizer):

1. Token stops (`StopChecker.check`), from token ids alone, in
   ``Scheduler.update_from_output`` as soon as the sampled token is appended: a stop token
   (`stop_token_ids`: the request's ``stop_token_ids``, and the model's EOS ids unless
   ``ignore_eos``), once ``min_tokens`` are out, ends it as FINISHED_STOPPED; ``max_tokens``
   or ``max_model_len`` ends it as FINISHED_LENGTH_CAPPED; a constraint that failed on the
   token (``GrammarState.error``) ends it as FINISHED_ERROR, whatever else holds. Deciding
   there frees the sequence's blocks before the next step is planned and never schedules a
   token past a limit. The
   sampler masks the same stop tokens while ``min_tokens`` are not out (`below_min_tokens`,
   ``penalties.apply_min_tokens``).
2. Stop strings, on the text, which exists only after the scheduler's update: each completion's
   ``IncrementalDetokenizer`` feeds the new text to its ``StopScanner`` (``stop_matcher.py``),
   searching once more than ``min_tokens`` tokens are out (vLLM's rule), and cuts the text at a
   match; ``LLMEngine`` then hands the match to ``Scheduler.stop_on_string``, where a stop
   string completed by the token that also reached a length limit wins over it (as in vLLM).
"""

from __future__ import annotations

from collections.abc import Iterable

from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.sequence import Sequence, SequenceStatus


def stop_token_ids(params: SamplingParams, eos_token_ids: Iterable[int]) -> list[int]:
    """The token ids that end a request: its ``stop_token_ids``, then the model's EOS ids
    unless it sets ``ignore_eos``."""
    return params.stop_token_ids + ([] if params.ignore_eos else list(eos_token_ids))


def below_min_tokens(seq: Sequence) -> bool:
    """Whether ``seq`` has fewer output tokens than its ``min_tokens``: its stop tokens are
    masked before sampling and do not stop it."""
    return seq.num_output_tokens < seq.params.min_tokens


class StopChecker:
    """The token-level stop rules of one engine (see the module's docstring for both kinds).

    Args:
        eos_token_ids: the model's end-of-sequence token ids.
        max_model_len: the engine's longest sequence (prompt + output), tokens.
    """

    def __init__(self, eos_token_ids: Iterable[int], max_model_len: int) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len

    def check(self, seq: Sequence) -> SequenceStatus | None:
        """Whether the token just appended to ``seq`` ends it: the FINISHED_* status, or None.
        A stop token id of ``stop_token_ids`` becomes ``seq.stop_reason``; an EOS id does not
        (as in vLLM)."""
        params = seq.params
        if seq.grammar is not None and seq.grammar.error is not None:
            return SequenceStatus.FINISHED_ERROR  # the request's own constraint failed
        if below_min_tokens(seq):
            return None
        last = seq.output_token_ids[-1]
        if last in params.stop_token_ids:
            seq.stop_reason = last
            return SequenceStatus.FINISHED_STOPPED
        if not params.ignore_eos and last in self.eos_token_ids:
            return SequenceStatus.FINISHED_STOPPED
        if seq.grammar is not None and seq.grammar.is_stopped:  # the output is complete
            return SequenceStatus.FINISHED_STOPPED
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return SequenceStatus.FINISHED_LENGTH_CAPPED
        return None
