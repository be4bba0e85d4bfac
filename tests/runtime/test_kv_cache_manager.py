"""KVCacheManager: chained block hashes, exact hits and block ids, the last-token rule, forks."""

from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.scheduling.kv_cache_manager import ROOT_HASH, KVCacheManager, hash_block_tokens
from llmc.runtime.sequence import Sequence


def seq(rid: str, tokens: list[int], **params) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(**params))


def admit(kv: KVCacheManager, s: Sequence) -> list[int]:
    """Admit like the scheduler: cached prefix, then slots for the rest of the tokens."""
    hits = kv.get_computed_blocks(s)
    assert kv.allocate_slots(s, s.num_tokens - len(hits) * kv.block_size, hits)
    s.num_computed_tokens = s.num_tokens
    return hits


def test_block_hash_is_chained_over_the_prefix():
    h0 = hash_block_tokens(ROOT_HASH, [1, 2])
    assert h0 == hash_block_tokens(ROOT_HASH, [1, 2])
    assert h0 != hash_block_tokens(ROOT_HASH, [2, 1])
    # The same tokens after a different first block hash differently.
    assert hash_block_tokens(h0, [3, 4]) != hash_block_tokens(
        hash_block_tokens(ROOT_HASH, [9, 9]), [3, 4]
    )


def test_shared_prefix_blocks_have_exact_ids_and_reference_counts():
    kv = KVCacheManager(num_blocks=6, block_size=4, enable_prefix_caching=True)
    prompt = list(range(100, 110))  # 10 tokens: 2 full blocks and 2 tokens
    a = seq("a", prompt)
    assert admit(kv, a) == [] and a.block_ids == [0, 1, 2]
    b = seq("b", prompt[:8] + [7, 7])
    assert admit(kv, b) == [0, 1] and b.block_ids == [0, 1, 3]
    assert [blk.ref_cnt for blk in kv.block_pool.blocks] == [2, 2, 1, 1, 0, 0]
    c = seq("c", prompt[:4] + [5, 5, 5, 5, 6])  # same first block, different second
    assert admit(kv, c) == [0] and c.block_ids == [0, 4, 5]


def test_a_full_hit_still_computes_the_last_token():
    kv = KVCacheManager(num_blocks=6, block_size=4, enable_prefix_caching=True)
    admit(kv, seq("a", list(range(8))))  # two full blocks, both cached
    b = seq("b", list(range(8)))
    assert kv.get_computed_blocks(b) == [0]  # (8 - 1) // 4 = 1 block: tokens 4..7 recomputed
    b = seq("b", list(range(9)))
    assert kv.get_computed_blocks(b) == [0, 1]


def test_eviction_is_least_recently_freed_first_and_breaks_the_chain():
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = seq("a", [1, 2, 3, 4])
    b = seq("b", [5, 6, 7, 8])
    admit(kv, a)  # blocks [0, 1]
    kv.free(a)  # queue: 2 3 1 0 (tail block first)
    admit(kv, b)  # blocks [2, 3]
    kv.free(b)  # queue: 1 0 3 2
    admit(kv, seq("c", [9, 10]))  # takes block 1: evicts a's second block
    assert kv.get_computed_blocks(seq("a2", [1, 2, 3, 4, 5])) == [0]
    assert kv.get_computed_blocks(seq("b2", [5, 6, 7, 8, 9])) == [2, 3]
    admit(kv, seq("d", [11, 12, 13, 14]))  # takes 0 and 3: a's first and b's second block
    assert kv.get_computed_blocks(seq("a3", [1, 2, 3, 4, 5])) == []
    assert kv.get_computed_blocks(seq("b3", [5, 6, 7, 8, 9])) == [2]


def test_allocation_that_does_not_fit_changes_nothing():
    kv = KVCacheManager(num_blocks=3, block_size=2, enable_prefix_caching=True)
    a = seq("a", [1, 2, 3, 4])
    admit(kv, a)
    kv.free(a)  # both blocks cached and free: queue 2 1 0
    b = seq("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    hits = kv.get_computed_blocks(b)
    assert hits == [0, 1]
    # 9 tokens need 5 blocks: the 2 hits (evictable) + 3 new, but only 3 are free in total.
    assert not kv.allocate_slots(b, 5, hits)
    assert b.block_ids == [] and kv.block_pool.num_free_blocks == 3
    assert [blk.ref_cnt for blk in kv.block_pool.blocks] == [0, 0, 0]


def test_off_switch_and_prompt_logprobs_skip_the_cache():
    kv = KVCacheManager(num_blocks=6, block_size=2, enable_prefix_caching=False)
    admit(kv, seq("a", [1, 2, 3]))
    assert kv.get_computed_blocks(seq("b", [1, 2, 3])) == []
    assert kv.block_pool.num_cached_blocks == 0
    kv = KVCacheManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    admit(kv, seq("a", [1, 2, 3]))
    assert kv.get_computed_blocks(seq("b", [1, 2, 3], prompt_logprobs=1)) == []
    assert kv.get_computed_blocks(seq("c", [1, 2, 3])) == [0]


def test_fork_shares_the_full_prompt_blocks_only():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    parent = seq("a", list(range(10)), n=2)
    admit(kv, parent)  # blocks [0, 1, 2]; block 2 holds 2 prompt tokens
    child = parent.fork(1)
    kv.fork(parent, child)
    assert child.block_ids == [0, 1] and child.num_computed_tokens == 8
    assert [blk.ref_cnt for blk in kv.block_pool.blocks[:3]] == [2, 2, 1]
    kv.free(parent)
    assert [blk.ref_cnt for blk in kv.block_pool.blocks[:3]] == [1, 1, 0]
