"""The plan of one step, handed from the scheduler to the step builder and back (vLLM's
``SchedulerOutput``)."""

from __future__ import annotations

from dataclasses import dataclass

from llmc.runtime.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence's share of a step.

    Attributes:
        seq: the request.
        num_computed_tokens: tokens already in the cache before this step (the first new token's
            position).
        num_new_tokens: tokens computed in this step (a prompt chunk, a recomputation, or the one
            token sampled last step).
        samples: whether this step reaches the end of the sequence, so a token is sampled.
        num_prompt_logprobs: positions ``num_computed_tokens ..`` whose logits give the logprobs
            of the prompt tokens after them (requests with ``prompt_logprobs``), before the
            sampling position.
        forks: new completions 1..n-1 of an n > 1 request, which sample from this sequence's
            logits row in this step (the end of its prompt) and share its full prompt blocks.
        num_draft_tokens: speculative decoding: the sequence's ``draft_token_ids`` computed
            after its last token (counted in ``num_new_tokens``), each with a logits row after
            the sampling row, so that one step verifies them.
    """

    seq: Sequence
    num_computed_tokens: int
    num_new_tokens: int
    samples: bool
    num_prompt_logprobs: int = 0
    forks: tuple[Sequence, ...] = ()
    num_draft_tokens: int = 0

    @property
    def num_logits_rows(self) -> int:
        """Rows of the step's logits that belong to this sequence."""
        return self.num_prompt_logprobs + self.samples + self.num_draft_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    """The plan of one step. Valid until `Scheduler.update_from_output` is called with it.

    Attributes:
        scheduled: sequences in step order (running decodes, running prompt chunks, then newly
            admitted ones).
        preempted_request_ids: requests preempted (sent back to waiting) while planning this step.
        num_batched_tokens: T, the sum of ``num_new_tokens``.
    """

    scheduled: tuple[ScheduledSequence, ...]
    preempted_request_ids: tuple[str, ...]
    num_batched_tokens: int

    @property
    def sampling(self) -> list[Sequence]:
        """The sequences that sample this step, in sampling order: each sampling sequence is
        followed by its forks, which share its logits row."""
        return [s for p in self.scheduled if p.samples for s in (p.seq, *p.forks)]
