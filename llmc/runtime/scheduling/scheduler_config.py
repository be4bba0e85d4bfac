"""The limits of the scheduler, checked once at startup."""

from __future__ import annotations

from dataclasses import dataclass, fields

from llmc.errors import EngineConfigError


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of the scheduler.

    Attributes:
        max_model_len: longest sequence (prompt + output) in tokens.
        block_size: tokens per KV block.
        num_blocks: blocks in the KV cache.
        max_num_seqs: most sequences running at once (in one step).
        max_num_batched_tokens: token budget of one step (T, the packed tokens).
        enable_prefix_caching: share cached full blocks between requests with the same prefix.
        max_num_forked_seqs: most running sequences that are completions 1..n-1 of n > 1
            requests (all requests together); the other slots are left to requests' first
            completions, so that a large-n request cannot keep new requests waiting.
            None: half of ``max_num_seqs``, at least 1 (`fork_limit`). ``max_num_seqs`` lifts
            the cap.
        max_decode_wait_steps: prefill-first scheduling: most consecutive steps in which
            running sequences' decodes wait while prompts are prefilled (SGLang's default
            policy, vLLM's V0 scheduler without chunking). A burst of prompts then gets its
            first tokens one step per prompt chunk instead of each step also carrying every
            earlier prompt's decode; the price is that running sequences' next token waits
            up to this many steps. 0: decodes always run first (vLLM v1).
        max_loras: a LoRA engine's adapter slots: most distinct adapters among the running
            sequences (a request of another adapter waits for one to finish); None: no LoRA.

    Raises:
        EngineConfigError: if a limit is < 1 (``max_decode_wait_steps`` < 0), or if the cache
            cannot hold one sequence of ``max_model_len`` tokens (such a request could never
            finish).
    """

    max_model_len: int
    block_size: int
    num_blocks: int
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    max_num_forked_seqs: int | None = None
    max_decode_wait_steps: int = 0
    max_loras: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            least = 0 if f.name == "max_decode_wait_steps" else 1
            if value is not None and not isinstance(value, bool) and value < least:
                raise EngineConfigError(f"{f.name} must be >= {least}, got {value}")
        capacity = self.num_blocks * self.block_size
        if capacity < self.max_model_len:
            raise EngineConfigError(
                f"the KV cache holds {capacity} tokens ({self.num_blocks} blocks of "
                f"{self.block_size}) but max_model_len is {self.max_model_len}; one sequence of "
                "max_model_len tokens must fit: lower max_model_len (--max-model-len) or give "
                "the cache more blocks (--kv-cache-memory, --num-blocks)"
            )

    @property
    def fork_limit(self) -> int:
        """``max_num_forked_seqs``, or by default half of ``max_num_seqs`` (at least 1)."""
        if self.max_num_forked_seqs is not None:
            return self.max_num_forked_seqs
        return max(self.max_num_seqs // 2, 1)
