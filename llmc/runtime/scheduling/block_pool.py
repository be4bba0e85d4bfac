"""The pool of fixed-size KV cache blocks with prefix caching (after vLLM v1's ``block_pool.py``).

The runner owns the cache tensors, [num_blocks, block_size, KVH, D] per layer; this pool only
decides which block ids are in use, and remembers which full blocks hold which token prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class KVCacheBlock:
    """Bookkeeping of one block.

    Attributes:
        block_id: index into the cache's first dimension, in [0, num_blocks).
        ref_cnt: number of sequences whose block table holds this block.
        block_hash: the chained hash of the prefix this full block ends (see
            ``kv_cache_manager.hash_block_tokens``) while it is in the prefix cache, else None.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


class BlockPool:
    """Hands out KV blocks, shares full blocks by reference count and caches freed ones (LRU).

    Free blocks (``ref_cnt == 0``) wait in a queue, least recently freed first: ``allocate``
    takes from the front, ``free`` appends at the back. A freed block that holds a cached prefix
    keeps its hash: a later request with the same prefix can take it back (``touch``) until
    ``allocate`` reaches it at the front of the queue and evicts it, so eviction is in LRU order.
    The queue is an ``OrderedDict`` rather than a deque because ``touch`` pulls a block out of the
    *middle* of the queue (O(1) with a dict, O(n) with a deque) - the reason vLLM's
    ``FreeKVCacheBlockQueue`` is a linked list. Block 0 is a block like any other.

    Args:
        num_blocks: number of blocks in the cache.

    Raises:
        ValueError: if ``num_blocks`` < 1.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}  # block hash -> id of the block holding it

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds, cached ones included (they are evictable)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the prefix cache, held or free."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences, in [0, 1] (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self._free) / self.num_blocks

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks from the front of the free queue, evicting cached ones.

        Returns:
            Their ids, in the order taken; each now has ``ref_cnt == 1`` and no hash.

        Raises:
            ValueError: if fewer than ``num_blocks`` blocks are free (check ``can_allocate``).
        """
        if num_blocks > len(self._free):
            raise ValueError(f"cannot allocate {num_blocks} blocks: only {len(self._free)} free")
        ids = []
        for _ in range(num_blocks):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            ids.append(block_id)
        return ids

    def get_cached_block(self, block_hash: bytes) -> int | None:
        """The id of the block holding the prefix ``block_hash``, or None (a miss)."""
        return self._cached.get(block_hash)

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take one more reference to each cached block; free ones leave the free queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                del self._free[block_id]
            block.ref_cnt += 1

    def cache_block(self, block_id: int, block_hash: bytes) -> None:
        """Enter a held, full block in the prefix cache under ``block_hash``.

        A block already cached keeps its hash. If another block already holds ``block_hash``
        (two requests computed the same prefix at once), this one stays uncached: one copy is
        enough, and it is freed for reuse like any uncached block.
        """
        block = self.blocks[block_id]
        if block.block_hash is None and block_hash not in self._cached:
            block.block_hash = block_hash
            self._cached[block_hash] = block_id

    def uncache(self, block_ids: Iterable[int]) -> None:
        """Take blocks out of the prefix cache: their KV is not what their hash says (the step
        that was to write it failed). Held blocks stay held, free ones free; blocks not in the
        cache are left alone."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; blocks left with none go to the back of the queue.

        Blocks are queued in the order given: callers pass a sequence's blocks in reverse so its
        tail blocks, the least likely to be shared, are evicted first.

        Raises:
            ValueError: if a block is already free (a double free is a scheduler bug).
        """
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                raise ValueError(f"block {block_id} is already free")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block_id] = None
