"""Turn a scheduler's plan into the packed arrays a runner executes (the model runner's input prep).

Loops run over sequences, never over tokens: per-token arrays come from numpy ``repeat``,
``arange`` and gathers.
"""

from __future__ import annotations

import dataclasses
from itertools import chain

import numpy as np

from llmc.runtime.runners.step_inputs import StepInputs
from llmc.runtime.scheduling.scheduler_output import SchedulerOutput


def build_step_inputs(scheduler_output: SchedulerOutput, block_size: int) -> StepInputs:
    """Pack the scheduled sequences' new tokens and their attention metadata (DESIGN §3).

    For sequence b with ``c`` computed and ``n`` new tokens, its tokens ``c:c+n`` (prompt tokens
    of a prefill chunk, or the last sampled token of a decode and its drafts) go to
    ``input_ids`` with positions ``c..c+n-1``; each is written to the cache slot
    ``block_ids[p // block_size] * block_size + p % block_size``; ``seq_lens[b] = c + n``. The
    block table is as wide as the longest one in the step.

    Args:
        scheduler_output: the plan of this step, straight from `Scheduler.schedule` (the
            sequences' blocks must already be allocated).
        block_size: tokens per KV block.

    Returns:
        The step's `StepInputs`; ``logits_indices`` lists, sequence by sequence in step order,
        the positions of its ``num_prompt_logprobs`` rows (its first new tokens) and then, if it
        samples, its last new token, or with drafts its last ``1 + num_draft_tokens`` (the last
        token, then each draft): ``ScheduledSequence.num_logits_rows`` rows each.

    Raises:
        ValueError: if the plan schedules no token.
    """
    planned = scheduler_output.scheduled
    if not planned:
        raise ValueError("cannot build a step from an empty schedule")
    token_lists = [
        p.seq.token_ids(
            p.num_computed_tokens, p.num_computed_tokens + p.num_new_tokens - p.num_draft_tokens
        )
        + p.seq.draft_token_ids[: p.num_draft_tokens]
        for p in planned
    ]
    step = pack_step(
        token_lists,
        [p.num_computed_tokens for p in planned],
        [p.seq.block_ids for p in planned],
        block_size,
    )
    if not any(p.num_prompt_logprobs or p.num_draft_tokens for p in planned):
        samples = np.fromiter((p.samples for p in planned), np.bool_, len(planned))
        logits_indices = (step.query_start_loc[1:][samples] - 1).astype(np.int64)
    else:
        qsl = step.query_start_loc
        logits_indices = np.concatenate(
            [
                np.r_[
                    np.arange(p.num_prompt_logprobs) + qsl[b],
                    np.arange(-1 - p.num_draft_tokens, 0) + qsl[b + 1] if p.samples else [],
                ]
                for b, p in enumerate(planned)
            ]
        ).astype(np.int64)
    return dataclasses.replace(step, logits_indices=logits_indices)


def pack_step(
    token_lists: list[list[int]],
    starts: list[int],
    block_ids: list[list[int]],
    block_size: int,
) -> StepInputs:
    """The packed arrays of a step that computes ``token_lists[b]`` at positions ``starts[b]``
    onwards for each sequence b, over its ``block_ids[b]`` (which must cover those positions).
    ``logits_indices`` is each sequence's last token (the caller may replace it)."""
    num_seqs = len(token_lists)
    num_new = np.fromiter((len(t) for t in token_lists), np.int32, num_seqs)
    starts_arr = np.asarray(starts, np.int32)
    query_start_loc = np.zeros(num_seqs + 1, np.int32)
    np.cumsum(num_new, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    input_ids = np.fromiter(chain.from_iterable(token_lists), np.int64, num_tokens)

    # Token t belongs to sequence seq_of[t]; its offset inside that sequence's query is
    # t - query_start_loc[seq_of[t]].
    seq_of = np.repeat(np.arange(num_seqs), num_new)
    positions = np.arange(num_tokens, dtype=np.int64) - query_start_loc[seq_of] + starts_arr[seq_of]

    max_blocks = max(len(ids) for ids in block_ids)
    block_tables = np.zeros((num_seqs, max_blocks), np.int32)
    for b, ids in enumerate(block_ids):
        block_tables[b, : len(ids)] = ids

    blocks = block_tables[seq_of, positions // block_size].astype(np.int64)
    slot_mapping = blocks * block_size + positions % block_size
    return StepInputs(
        input_ids=input_ids,
        positions=positions,
        seq_lens=starts_arr + num_new,
        query_start_loc=query_start_loc,
        block_tables=block_tables,
        slot_mapping=slot_mapping,
        logits_indices=(query_start_loc[1:] - 1).astype(np.int64),
    )
