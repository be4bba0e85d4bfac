"""Which KV blocks a sequence holds, with prefix caching (after vLLM v1's ``kv_cache_manager.py``).

Sits between the scheduler and the `BlockPool`: the scheduler asks "which prefix of this request
is already cached?" and "give it room for n more tokens"; this class hashes the sequence's full
blocks, looks them up, shares them by reference count and enters newly full blocks in the cache.
"""

from __future__ import annotations

import hashlib
from array import array

from llmc.runtime.scheduling.block_pool import BlockPool
from llmc.runtime.sequence import Sequence

#: Parent hash of a sequence's first block.
ROOT_HASH = b"llmc-prefix-cache-root"


def hash_block_tokens(parent_hash: bytes, token_ids: list[int]) -> bytes:
    """The chained hash of a full block: SHA-256 of the parent block's hash and its token ids.

    Chaining makes the hash name the whole prefix up to and including the block, so equal hashes
    mean equal prefixes (vLLM's ``hash_block_tokens``). The only other thing that changes a
    block's KV here is the LoRA adapter, which the first block's parent names (``root_hash``);
    the KV cache dtype and scales are fixed per engine, and there are no images.
    SHA-256 rather than Python's ``hash`` so that a crafted prompt cannot collide with another
    user's prefix.
    """
    return hashlib.sha256(parent_hash + array("q", token_ids).tobytes()).digest()


def root_hash(seq: Sequence) -> bytes:
    """The parent hash of a sequence's first block: ``ROOT_HASH`` on the base model, a hash
    of its adapter's name and digest under a LoRA adapter (whose KV differs from the base
    model's and from another adapter's, or the same name's after a reload)."""
    if seq.lora_name is None:
        return ROOT_HASH
    key = f"lora:{seq.lora_name}:{seq.lora_digest}".encode()
    return hashlib.sha256(ROOT_HASH + key).digest()


class KVCacheManager:
    """Allocates blocks for sequences and finds their cached prefixes.

    Args:
        num_blocks: blocks in the KV cache.
        block_size: tokens per block.
        enable_prefix_caching: look up and register full blocks; off, blocks are only shared
            between the completions of one request (n > 1).

    Attributes:
        block_pool: the pool.
        prefix_cache_queries: cumulative prompt tokens of admitted requests looked up.
        prefix_cache_hits: cumulative tokens among them whose blocks were found.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.block_pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """The cached blocks holding the longest cached prefix of a sequence with nothing computed.

        At most ``(num_tokens - 1) // block_size`` blocks: the last token is always computed,
        since its logits are needed to sample (vLLM does the same). Requests asking for prompt
        logprobs get no hit (their prompt positions need logits). The blocks are not yet taken:
        pass them to `allocate_slots`.
        """
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return []
        self._update_block_hashes(seq)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in seq.block_hashes[:max_blocks]:
            block_id = self.block_pool.get_cached_block(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup (tokens queried, tokens hit)."""
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_tokens
            self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] = ()
    ) -> bool:
        """Give ``seq`` the blocks for ``computed_blocks`` plus ``num_new_tokens`` more tokens.

        All or nothing: returns False, changing nothing, when the pool is short. On success the
        cached ``computed_blocks`` are appended to its block table (the caller then advances
        ``num_computed_tokens`` past them), new blocks after them, and the blocks that this step
        fills are entered in the prefix cache - before they are computed, as in vLLM: a request
        admitted later in the same step may share them, because a step writes every new token's
        KV before any attention reads the cache. The contract that makes this safe: if the step
        does not run to the end, the caller takes those blocks out again with `uncache_step`
        before anything frees them (``Scheduler.fail_step``), so no hash names unwritten KV.
        """
        bs = self.block_size
        num_blocks_before = len(seq.block_ids) + len(computed_blocks)
        num_computed = seq.num_computed_tokens + len(computed_blocks) * bs
        total = num_computed + num_new_tokens
        num_needed = max(-(-total // bs) - num_blocks_before, 0)
        pool = self.block_pool
        num_evictable = sum(pool.blocks[b].ref_cnt == 0 for b in computed_blocks)
        if num_needed + num_evictable > pool.num_free_blocks:
            return False
        pool.touch(computed_blocks)
        seq.block_ids.extend(computed_blocks)
        seq.block_ids.extend(pool.allocate(num_needed))
        if self.enable_prefix_caching:
            self._update_block_hashes(seq)
            # Blocks full before this step were entered when they filled (or are hits).
            for i in range(num_computed // bs, min(total // bs, len(seq.block_hashes))):
                pool.cache_block(seq.block_ids[i], seq.block_hashes[i])
        return True

    def uncache_step(self, seq: Sequence, num_computed_tokens: int, num_new_tokens: int) -> None:
        """Undo the prefix caching of a step that failed: the blocks that tokens
        ``num_computed_tokens .. num_computed_tokens + num_new_tokens`` of ``seq`` were to fill
        (those `allocate_slots` entered in the cache early) leave the cache. Blocks full before
        the step were written by an earlier step and stay cached. Call it while ``seq`` still
        holds its blocks."""
        bs = self.block_size
        end = min((num_computed_tokens + num_new_tokens) // bs, len(seq.block_ids))
        self.block_pool.uncache(seq.block_ids[num_computed_tokens // bs : end])

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Share the parent's full prompt blocks with a new completion of the same request.

        Only full blocks are shared, so no block is ever written by two sequences; the child
        recomputes the prompt's last partial block (fewer than ``block_size`` tokens).
        """
        num_shared = parent.num_prompt_tokens // self.block_size
        shared = parent.block_ids[:num_shared]
        self.block_pool.touch(shared)
        child.block_ids = list(shared)
        child.block_hashes = list(parent.block_hashes[:num_shared])
        child.num_computed_tokens = num_shared * self.block_size

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's blocks; cached ones stay findable until evicted."""
        # Tail blocks first: they go to the front of the eviction order (see BlockPool.free).
        self.block_pool.free(reversed(seq.block_ids))
        seq.block_ids = []

    def _update_block_hashes(self, seq: Sequence) -> None:
        """Extend ``seq.block_hashes`` to every full block of its tokens."""
        bs = self.block_size
        hashes = seq.block_hashes
        for i in range(len(hashes), seq.num_tokens // bs):
            parent = hashes[-1] if hashes else root_hash(seq)
            hashes.append(hash_block_tokens(parent, seq.token_ids(i * bs, (i + 1) * bs)))
