"""The warm-up step: within every limit it is given, and a valid step for the real kernel."""

from __future__ import annotations

import numpy as np
import pytest

from llmc.runtime.runners.warmup import warmup_step


def test_the_default_gemma_limits_give_sixteen_prefills_of_128_tokens():
    # max_num_tokens 2048, max_batch 16, max_seq_len 4096, block 16, a 4096-block pool.
    step = warmup_step(2048, 16, 4096, 16, 4096)
    assert step.num_tokens == 2048 and step.num_seqs == 16
    assert step.seq_lens.tolist() == [128] * 16
    assert step.block_tables.shape == (16, 8)
    assert step.block_tables[3].tolist() == list(range(24, 32))
    assert step.slot_mapping[128 * 3 : 128 * 3 + 3].tolist() == [384, 385, 386]
    assert step.logits_indices.tolist() == [128 * b + 127 for b in range(16)]


@pytest.mark.parametrize(
    ("num_tokens", "max_num_seqs", "max_model_len", "block_size", "num_blocks"),
    [
        (64, 8, 64, 4, 128),
        (100, 3, 40, 16, 5),  # the pool holds one 34-token sequence (3 blocks) only
        (2048, 16, 64, 4, 16),  # the pool bounds the step
        (7, 16, 4096, 16, 1),
        (1, 1, 1, 1, 1),
        (2048, 256, 4096, 16, 4096),  # more sequences than a budget split makes sensible
    ],
)
def test_the_step_keeps_every_limit_and_the_step_contract(
    num_tokens, max_num_seqs, max_model_len, block_size, num_blocks
):
    step = warmup_step(num_tokens, max_num_seqs, max_model_len, block_size, num_blocks)
    lens = step.seq_lens.tolist()
    assert 1 <= step.num_tokens <= num_tokens and step.num_seqs <= max_num_seqs
    assert all(1 <= n <= max_model_len for n in lens) and sum(lens) == step.num_tokens
    assert step.block_tables.size <= num_blocks
    assert len(np.unique(step.block_tables)) == step.block_tables.size  # no block shared
    assert step.query_start_loc.tolist() == [0, *np.cumsum(lens).tolist()]
    for b, n in enumerate(lens):
        start = step.query_start_loc[b]
        positions = step.positions[start : start + n]
        assert positions.tolist() == list(range(n))
        slots = step.slot_mapping[start : start + n]
        blocks = step.block_tables[b][positions // block_size]
        assert (slots == blocks.astype(np.int64) * block_size + positions % block_size).all()
    assert step.logits_indices.tolist() == [int(s) - 1 for s in step.query_start_loc[1:]]


def test_limits_below_one_are_refused():
    with pytest.raises(ValueError, match="must be >= 1"):
        warmup_step(0, 16, 4096, 16, 4096)
