"""BlockPool: exact block ids, LRU free order, reference counts, errors."""

import pytest

from llmc.runtime.scheduling.block_pool import BlockPool


def test_allocate_takes_lowest_ids_first_from_a_fresh_pool():
    pool = BlockPool(10)
    assert pool.num_free_blocks == 10
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate(2) == [3, 4]
    assert pool.num_free_blocks == 5
    assert pool.usage == pytest.approx(0.5)
    assert [b.ref_cnt for b in pool.blocks] == [1] * 5 + [0] * 5


def test_freed_blocks_are_reused_last_in_the_order_freed():
    pool = BlockPool(6)
    a = pool.allocate(3)  # [0, 1, 2]
    pool.free(reversed(a))  # queue: 3 4 5 2 1 0
    assert pool.num_free_blocks == 6
    assert [b.ref_cnt for b in pool.blocks] == [0] * 6
    assert pool.allocate(4) == [3, 4, 5, 2]
    pool.free([4])  # queue: 1 0 4
    assert pool.allocate(3) == [1, 0, 4]
    assert pool.num_free_blocks == 0


def test_can_allocate_is_exact():
    pool = BlockPool(4)
    pool.allocate(1)
    assert pool.can_allocate(3)
    assert not pool.can_allocate(4)
    assert pool.can_allocate(0)


def test_allocating_too_many_raises_and_changes_nothing():
    pool = BlockPool(4)
    pool.allocate(2)
    with pytest.raises(ValueError, match="only 2 free"):
        pool.allocate(3)
    assert pool.num_free_blocks == 2
    assert pool.allocate(2) == [2, 3]


def test_double_free_raises():
    pool = BlockPool(4)
    ids = pool.allocate(2)
    pool.free(ids)
    with pytest.raises(ValueError, match="block 0 is already free"):
        pool.free([0])


def test_block_shared_by_two_owners_is_freed_with_the_last_reference():
    # Prefix caching will share blocks; the reference count already supports it.
    pool = BlockPool(3)
    (b,) = pool.allocate(1)
    pool.blocks[b].ref_cnt += 1  # a second sequence holds it
    pool.free([b])
    assert pool.num_free_blocks == 2
    pool.free([b])
    assert pool.num_free_blocks == 3


def test_empty_pool_is_refused():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)


# ---- prefix caching -------------------------------------------------------------------------


def test_freed_cached_block_is_found_until_allocate_evicts_it_in_lru_order():
    pool = BlockPool(4)
    a = pool.allocate(2)  # [0, 1]
    pool.cache_block(0, b"h0")
    pool.cache_block(1, b"h1")
    pool.free(reversed(a))  # queue: 2 3 1 0
    assert pool.num_free_blocks == 4 and pool.num_cached_blocks == 2
    assert pool.get_cached_block(b"h1") == 1
    assert pool.allocate(3) == [2, 3, 1]  # the third takes block 1 and evicts its hash
    assert pool.get_cached_block(b"h1") is None
    assert pool.get_cached_block(b"h0") == 0
    assert pool.blocks[1].block_hash is None and pool.num_cached_blocks == 1


def test_touch_takes_a_cached_block_out_of_the_middle_of_the_free_queue():
    pool = BlockPool(4)
    pool.cache_block(pool.allocate(1)[0], b"h0")
    pool.free([0])  # queue: 1 2 3 0
    pool.touch([0])
    assert pool.blocks[0].ref_cnt == 1 and pool.num_free_blocks == 3
    pool.touch([0])  # a second holder: no queue change
    assert pool.blocks[0].ref_cnt == 2 and pool.num_free_blocks == 3
    assert pool.allocate(3) == [1, 2, 3]
    pool.free([0])
    assert pool.num_free_blocks == 0  # still held once
    pool.free([0])
    assert pool.allocate(1) == [0]


def test_a_prefix_already_cached_is_not_cached_twice():
    pool = BlockPool(3)
    x, y = pool.allocate(2)
    pool.cache_block(x, b"same")
    pool.cache_block(y, b"same")  # two requests computed the same block at once
    assert pool.get_cached_block(b"same") == x and pool.blocks[y].block_hash is None
    pool.cache_block(x, b"other")  # a cached block keeps its first hash
    assert pool.blocks[x].block_hash == b"same" and pool.get_cached_block(b"other") is None


def test_uncached_blocks_are_not_found_and_keep_their_holders():
    pool = BlockPool(4)
    x, y = pool.allocate(2)
    pool.cache_block(x, b"hx")
    pool.cache_block(y, b"hy")
    pool.uncache([x, 2])  # block 2 is free and uncached: left alone
    assert pool.get_cached_block(b"hx") is None and pool.blocks[x].block_hash is None
    assert pool.get_cached_block(b"hy") == y and pool.num_cached_blocks == 1
    assert pool.blocks[x].ref_cnt == 1 and pool.num_free_blocks == 2
    pool.cache_block(x, b"hx2")  # a block out of the cache can be entered again
    assert pool.get_cached_block(b"hx2") == x
