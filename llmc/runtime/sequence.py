"""The state of one request as it moves through the engine (nano-vllm's Sequence, vLLM's Request).

A `Sequence` is the only object that crosses the boundaries between scheduler, step builder,
sampler and detokenizer. Its tokens are the prompt followed by the generated tokens;
``num_computed_tokens`` says how many of them already have their keys and values in the KV cache.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmc.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from llmc.runtime.structured.grammar import GrammarState


class SequenceStatus(enum.Enum):
    """Where a request is in its life; the FINISHED_* members say why it ended."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED_STOPPED = enum.auto()  # EOS, a stop token id or a stop string
    FINISHED_LENGTH_CAPPED = enum.auto()  # max_tokens or max_model_len reached
    FINISHED_ABORTED = enum.auto()  # cancelled by the caller
    FINISHED_ERROR = enum.auto()  # its own constraint failed (``GrammarState.error``)

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS


# OpenAI's finish_reason strings, as vLLM reports them.
_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_ERROR: "error",  # vLLM v1's FinishReason.ERROR
}


@dataclass(eq=False)  # identity semantics: two requests are never "equal"
class Sequence:
    """One request: its tokens, its place in the KV cache and its timing.

    Attributes:
        request_id: the caller's id, unique among unfinished requests.
        prompt_token_ids: the prompt, never empty.
        params: how to sample and when to stop.
        prompt: the prompt text when the caller gave one (echoed in outputs), else None.
        arrival_time: when the request was added, in seconds of ``time.monotonic()``.
        output_token_ids: the generated tokens so far.
        status: see `SequenceStatus`.
        num_computed_tokens: how many leading tokens (prompt then output) have their keys and
            values in the cache. Reset to 0 when the request is preempted (recomputed later).
        block_ids: the KV blocks holding those tokens, in order; token i lives in
            ``block_ids[i // block_size]`` at offset ``i % block_size``.
        first_token_time: when the first output token was appended (``time.monotonic()``), for
            TTFT; None before.
        first_scheduled_time: when the scheduler first admitted it (``time.monotonic()``): its
            time in the queue ends there; None before.
        generator: the request's own torch.Generator, created when ``params.seed`` is set
            (seeded with ``params.completion_seed(index)``).
        index: which of the request's ``params.n`` completions this sequence is (0..n-1).
        block_hashes: chained hashes of the full blocks of its tokens so far (prefix caching).
        num_cached_tokens: prompt tokens whose KV came from the prefix cache at first admission.
        stop_reason: the stop token id or stop string that finished it, else None.
        grammar: where its output is in its grammar (``params.structured_outputs``), advanced
            by `append_token`; None for an unconstrained request.
        draft_token_ids: speculative decoding: the tokens proposed to follow it in the next
            step (verified by that step, never part of the output until accepted).
        num_draft_computed: speculative decoding with a draft model: leading tokens whose KV
            is in the draft model's cache (same blocks as the target's). Reset by preemption.
        lora_name: the LoRA adapter that serves it (``llmc.runtime.lora``); None: the base
            model.
        lora_digest: that adapter's digest (sha256 hex of its files): with the name, what
            its prefix-cache hashes start from (``kv_cache_manager.root_hash``).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    first_token_time: float | None = None
    first_scheduled_time: float | None = None
    generator: torch.Generator | None = None
    index: int = 0
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached_tokens: int = 0
    stop_reason: int | str | None = None
    grammar: GrammarState | None = None
    draft_token_ids: list[int] = field(default_factory=list)
    num_draft_computed: int = 0
    lora_name: str | None = None
    lora_digest: str | None = None

    def __post_init__(self) -> None:
        if self.params.seed is not None and self.generator is None:
            import torch  # only seeded requests pay for the import here

            seed = self.params.completion_seed(self.index)
            self.generator = torch.Generator().manual_seed(seed)

    def fork(self, index: int) -> Sequence:
        """Completion ``index`` of the same request: same prompt, no output, no blocks yet.

        The caller shares the parent's computed blocks with it (``KVCacheManager.fork``).
        """
        return Sequence(
            self.request_id,
            self.prompt_token_ids,
            self.params,
            prompt=self.prompt,
            arrival_time=self.arrival_time,
            status=self.status,
            index=index,
            num_cached_tokens=self.num_cached_tokens,
            grammar=self.grammar.fresh() if self.grammar is not None else None,
            lora_name=self.lora_name,
            lora_digest=self.lora_digest,
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        if self.output_token_ids:
            return self.output_token_ids[-1]
        return self.prompt_token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def key(self) -> tuple[str, int]:
        """(request id, completion index): unique among unfinished sequences."""
        return (self.request_id, self.index)

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's finish reason once finished ("stop", "length", "abort"), else None."""
        return _FINISH_REASONS.get(self.status)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens ``start:end`` of prompt + output, without copying the whole sequence."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    def append_token(self, token_id: int) -> None:
        """Append one sampled token, stamp the first-token time and advance the grammar (a
        grammar that refuses the token records why, ``grammar.error``; the stop checker then
        ends the sequence)."""
        if self.grammar is not None:
            self.grammar.accept(token_id)
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.output_token_ids.append(token_id)
