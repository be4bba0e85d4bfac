"""Turn a scheduler's plan into the packed arrays a runner executes (the model runner's input prep).

Loops run over sequences, never over tokens: per-token arrays come from numpy ``repeat``,
``arange`` and gathers.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from llmc.runtime.scheduler_output import SchedulerOutput
from llmc.runtime.step_inputs import StepInputs


def build_step_inputs(scheduler_output: SchedulerOutput, block_size: int) -> StepInputs:
    """Pack the scheduled sequences' new tokens and their attention metadata (DESIGN §3).

    For sequence b with ``c`` computed and ``n`` new tokens, its tokens ``c:c+n`` (prompt tokens of
    a prefill chunk, or the last sampled token of a decode) go to ``input_ids`` with positions
    ``c..c+n-1``; each is written to the cache slot ``block_ids[p // block_size] * block_size +
    p % block_size``; ``seq_lens[b] = c + n``. The block table is as wide as the longest one in the
    step.

    Args:
        scheduler_output: the plan of this step, straight from `Scheduler.schedule` (the
            sequences' blocks must already be allocated).
        block_size: tokens per KV block.

    Returns:
        The step's `StepInputs`; ``logits_indices`` lists, sequence by sequence in step order,
        the positions of its ``num_prompt_logprobs`` rows (its first new tokens) and then, if it
        samples, its last new token: ``ScheduledSequence.num_logits_rows`` rows each.

    Raises:
        ValueError: if the plan schedules no token.
    """
    planned = scheduler_output.scheduled
    if not planned:
        raise ValueError("cannot build a step from an empty schedule")
    num_seqs = len(planned)
    num_new = np.fromiter((p.num_new_tokens for p in planned), np.int32, num_seqs)
    starts = np.fromiter((p.num_computed_tokens for p in planned), np.int32, num_seqs)
    samples = np.fromiter((p.samples for p in planned), np.bool_, num_seqs)

    query_start_loc = np.zeros(num_seqs + 1, np.int32)
    np.cumsum(num_new, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])

    token_lists = [
        p.seq.token_ids(p.num_computed_tokens, p.num_computed_tokens + p.num_new_tokens)
        for p in planned
    ]
    input_ids = np.fromiter(chain.from_iterable(token_lists), np.int64, num_tokens)

    # Token t belongs to sequence seq_of[t]; its offset inside that sequence's query is
    # t - query_start_loc[seq_of[t]].
    seq_of = np.repeat(np.arange(num_seqs), num_new)
    positions = np.arange(num_tokens, dtype=np.int64) - query_start_loc[seq_of] + starts[seq_of]

    max_blocks = max(len(p.seq.block_ids) for p in planned)
    block_tables = np.zeros((num_seqs, max_blocks), np.int32)
    for b, p in enumerate(planned):
        block_tables[b, : len(p.seq.block_ids)] = p.seq.block_ids

    blocks = block_tables[seq_of, positions // block_size].astype(np.int64)
    slot_mapping = blocks * block_size + positions % block_size

    logits_indices = (query_start_loc[1:][samples] - 1).astype(np.int64)
    if any(p.num_prompt_logprobs for p in planned):
        logits_indices = np.concatenate(
            [
                np.r_[
                    np.arange(p.num_prompt_logprobs) + query_start_loc[b],
                    [query_start_loc[b + 1] - 1] if p.samples else [],
                ]
                for b, p in enumerate(planned)
            ]
        ).astype(np.int64)
    return StepInputs(
        input_ids=input_ids,
        positions=positions,
        seq_lens=starts + num_new,
        query_start_loc=query_start_loc,
        block_tables=block_tables,
        slot_mapping=slot_mapping,
        logits_indices=logits_indices,
    )
