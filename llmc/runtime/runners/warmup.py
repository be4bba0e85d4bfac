"""The warm-up step an engine runs once at load: the largest step its limits allow.

Why: the first step of a given size pays for the runner's memory (ONNX Runtime's arenas grow to
the step's intermediate tensors, each page faulted in and zeroed); later steps reuse it. Left to
the first request, that cost lands on its time to first token: on Gemma 3 270M (float32, 2-core
AMD EPYC) the first 2048-token prefill step took 4.9 s and the next ones 3.9 s. vLLM runs a
dummy batch of ``max_num_batched_tokens`` at startup for the same reason (its profile run).

The step writes keys and values into KV blocks ``0..n-1`` of the pool, which are all free at load;
nothing reads them before a real request has written its own.
"""

from __future__ import annotations

import numpy as np

from llmc.runtime.runners.step_inputs import StepInputs


def warmup_step(
    num_tokens: int, max_num_seqs: int, max_model_len: int, block_size: int, num_blocks: int
) -> StepInputs:
    """A prefill step of up to ``num_tokens`` tokens (the scheduler's token budget) split into up
    to ``max_num_seqs`` sequences of equal length (at most ``max_model_len`` each), placed in
    consecutive KV blocks from 0 and cut to fit ``num_blocks``. Every token id is 0; each
    sequence asks for its last position's logits, as a real prefill does.

    Raises ValueError if any limit is below 1.
    """
    limits = (num_tokens, max_num_seqs, max_model_len, block_size, num_blocks)
    if min(limits) < 1:
        raise ValueError(
            "num_tokens, max_num_seqs, max_model_len, block_size and num_blocks must be >= 1, "
            f"got {limits}"
        )
    num_seqs = min(max_num_seqs, num_tokens)
    seq_len = min(-(-num_tokens // num_seqs), max_model_len, num_blocks * block_size)
    blocks_per_seq = -(-seq_len // block_size)
    num_seqs = min(num_seqs, num_blocks // blocks_per_seq, -(-num_tokens // seq_len))
    lens = [seq_len] * num_seqs
    lens[-1] = min(seq_len, num_tokens - seq_len * (num_seqs - 1))
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    block_tables = np.arange(num_seqs * blocks_per_seq, dtype=np.int32).reshape(num_seqs, -1)
    positions = np.concatenate([np.arange(n) for n in lens]).astype(np.int64)
    first_slot = np.repeat(block_tables[:, 0].astype(np.int64) * block_size, lens)
    return StepInputs(
        input_ids=np.zeros(int(starts[-1]), np.int64),
        positions=positions,
        seq_lens=np.array(lens, np.int32),
        query_start_loc=starts,
        block_tables=block_tables,
        slot_mapping=first_slot + positions,
        logits_indices=(starts[1:] - 1).astype(np.int64),
    )
