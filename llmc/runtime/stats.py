"""A snapshot of the engine's state and counters, for ``/metrics`` and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    """What `LLMEngine.stats` reports (vLLM's scheduler and prefix-cache statistics).

    Attributes:
        num_running: sequences in the running set (scheduled in the last step or holding blocks).
        num_waiting: sequences waiting for admission (new or preempted).
        kv_cache_usage: fraction of KV blocks in use, in [0, 1]; cached blocks that no request
            holds count as free (they are evictable), as in vLLM's ``kv_cache_usage_perc``.
        prefix_cache_queries: cumulative prompt tokens looked up in the prefix cache.
        prefix_cache_hits: cumulative prompt tokens found there (their KV was reused); the hit
            rate is ``prefix_cache_hits / prefix_cache_queries``.
        num_preemptions: cumulative sequences preempted (freed, to be recomputed).
        num_free_blocks: KV blocks no request holds (including cached, evictable ones).
        num_total_blocks: KV blocks in the pool.
        spec_decode_num_drafts: cumulative verifications of drafted tokens (one per sequence
            and step that speculated).
        spec_decode_num_draft_tokens: cumulative tokens drafted and verified.
        spec_decode_num_accepted_tokens: cumulative drafted tokens the target agreed with.
        running_lora_adapters: the LoRA adapters of the running sequences (sorted names).
        waiting_lora_adapters: those of the waiting sequences (sorted names).
        max_lora: the engine's adapter slots (0 without LoRA).
    """

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_free_blocks: int
    num_total_blocks: int
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()
    max_lora: int = 0

    @property
    def spec_decode_acceptance_rate(self) -> float:
        """Accepted over drafted tokens, 0 before the first draft."""
        if self.spec_decode_num_draft_tokens == 0:
            return 0.0
        return self.spec_decode_num_accepted_tokens / self.spec_decode_num_draft_tokens

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hits over queries in tokens, 0 before the first query."""
        if self.prefix_cache_queries == 0:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries
