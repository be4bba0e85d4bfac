"""The pool of fixed-size KV cache blocks (after vLLM v1's `block_pool.py`).

The runner owns the cache tensors, [num_blocks, block_size, KVH, D] per layer; this pool only
decides which block ids are in use. Each block has a reference count so that, once prefix caching
lands (DESIGN §7), several sequences can share a full block; today every count is 0 or 1.
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
    """

    block_id: int
    ref_cnt: int = 0


class BlockPool:
    """Hands out KV blocks in O(1) and takes them back in O(1).

    Free blocks wait in a queue, least recently freed first: ``allocate`` takes from the front,
    ``free`` appends at the back. The queue is an ``OrderedDict`` rather than a deque because
    prefix caching must also pull a cached block out of the *middle* of the queue when a new
    request hits it (O(1) with a dict, O(n) with a deque) - the reason vLLM's
    ``FreeKVCacheBlockQueue`` is a linked list. The front of the queue is then the LRU eviction
    order. Block 0 is a block like any other.

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

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1] (vLLM's ``kv_cache_usage_perc`` metric)."""
        return 1.0 - len(self._free) / self.num_blocks

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks from the front of the free queue.

        Returns:
            Their ids, in the order taken; each now has ``ref_cnt == 1``.

        Raises:
            ValueError: if fewer than ``num_blocks`` blocks are free (check ``can_allocate``).
        """
        if num_blocks > len(self._free):
            raise ValueError(f"cannot allocate {num_blocks} blocks: only {len(self._free)} free")
        ids = []
        for _ in range(num_blocks):
            block_id, _ = self._free.popitem(last=False)
            self.blocks[block_id].ref_cnt = 1
            ids.append(block_id)
        return ids

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; blocks left with none go to the back of the queue.

        Blocks are queued in the order given: callers pass a sequence's blocks in reverse so its
        tail blocks, the least likely to be shared, are evicted first once prefix caching exists.

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
