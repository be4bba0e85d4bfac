"""build_step_inputs against hand-computed arrays and a per-token reference."""

import random

import numpy as np
import pytest

from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.scheduling.scheduler import (
    ScheduledSequence,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)
from llmc.runtime.scheduling.step_builder import build_step_inputs
from llmc.runtime.sequence import Sequence


def make_seq(rid, prompt, output=(), blocks=()):
    seq = Sequence(rid, list(prompt), SamplingParams())
    seq.output_token_ids = list(output)
    seq.block_ids = list(blocks)
    return seq


def make_output(entries):
    scheduled = tuple(
        ScheduledSequence(seq, c, n, c + n == seq.num_tokens) for seq, c, n in entries
    )
    return SchedulerOutput(scheduled, (), sum(n for _, _, n in entries))


def test_mixed_prefill_decode_and_chunk_by_hand():
    a = make_seq("a", range(10, 16), blocks=[3, 7])  # whole prompt, samples
    b = make_seq("b", range(20, 25), output=[25, 26], blocks=[1, 5])  # decode of token 26
    c = make_seq("c", range(30, 40), blocks=[8, 2])  # 2nd chunk of 4, does not sample
    step = build_step_inputs(make_output([(a, 0, 6), (b, 6, 1), (c, 4, 4)]), block_size=4)

    np.testing.assert_array_equal(step.input_ids, [10, 11, 12, 13, 14, 15, 26, 34, 35, 36, 37])
    np.testing.assert_array_equal(step.positions, [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7])
    np.testing.assert_array_equal(step.seq_lens, [6, 7, 8])
    np.testing.assert_array_equal(step.query_start_loc, [0, 6, 7, 11])
    np.testing.assert_array_equal(step.block_tables, [[3, 7], [1, 5], [8, 2]])
    # a: block 3 -> slots 12..15, block 7 -> 28, 29; b: position 6 = block 5 offset 2;
    # c: positions 4..7 = block 2 offsets 0..3.
    np.testing.assert_array_equal(step.slot_mapping, [12, 13, 14, 15, 28, 29, 22, 8, 9, 10, 11])
    np.testing.assert_array_equal(step.logits_indices, [5, 6])
    assert (step.num_tokens, step.num_seqs) == (11, 3)
    dtypes = [step.input_ids, step.positions, step.slot_mapping, step.logits_indices]
    assert all(x.dtype == np.int64 for x in dtypes)
    dtypes = [step.seq_lens, step.query_start_loc, step.block_tables]
    assert all(x.dtype == np.int32 for x in dtypes)


def test_recompute_spans_prompt_and_output_and_pads_block_table_with_zero():
    a = make_seq("a", [5, 6, 7], output=[8, 9], blocks=[4, 6, 9])  # preempted, recomputed
    b = make_seq("b", [1], output=[2], blocks=[3])
    step = build_step_inputs(make_output([(a, 0, 5), (b, 1, 1)]), block_size=2)
    np.testing.assert_array_equal(step.input_ids, [5, 6, 7, 8, 9, 2])
    np.testing.assert_array_equal(step.block_tables, [[4, 6, 9], [3, 0, 0]])
    np.testing.assert_array_equal(step.slot_mapping, [8, 9, 12, 13, 18, 7])
    np.testing.assert_array_equal(step.logits_indices, [4, 5])


def reference(entries, block_size):
    """Per-token loops: the obvious way to build a step."""
    ids, pos, slots, logits = [], [], [], []
    for seq, c, n in entries:
        tokens = seq.prompt_token_ids + seq.output_token_ids
        for p in range(c, c + n):
            ids.append(tokens[p])
            pos.append(p)
            slots.append(seq.block_ids[p // block_size] * block_size + p % block_size)
        if c + n == seq.num_tokens:
            logits.append(len(ids) - 1)
    return ids, pos, slots, logits


def test_random_steps_from_the_scheduler_match_the_per_token_reference():
    rng = random.Random(1)
    cfg = SchedulerConfig(
        max_model_len=40, block_size=3, num_blocks=40, max_num_seqs=5, max_num_batched_tokens=17
    )
    sched = Scheduler(cfg, eos_token_ids=set())
    for i in range(12):
        prompt = [rng.randrange(500) for _ in range(rng.randint(1, 20))]
        sched.add_request(Sequence(str(i), prompt, SamplingParams(max_tokens=8)))
    num_steps = 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        entries = [(s.seq, s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled]
        step = build_step_inputs(out, block_size=3)
        ids, pos, slots, logits = reference(entries, 3)
        np.testing.assert_array_equal(step.input_ids, ids)
        np.testing.assert_array_equal(step.positions, pos)
        np.testing.assert_array_equal(step.slot_mapping, slots)
        np.testing.assert_array_equal(step.logits_indices, logits)
        np.testing.assert_array_equal(step.seq_lens, [c + n for _, c, n in entries])
        for b, (seq, _, _) in enumerate(entries):
            assert list(step.block_tables[b, : len(seq.block_ids)]) == seq.block_ids
            assert not step.block_tables[b, len(seq.block_ids) :].any()
        sched.update_from_output(out, [rng.randrange(2, 500) for _ in out.sampling])
        num_steps += 1
    assert num_steps > 12


def test_empty_schedule_is_refused():
    with pytest.raises(ValueError, match="empty"):
        build_step_inputs(SchedulerOutput((), (), 0), block_size=4)


def test_prompt_logprob_rows_come_before_the_sampling_row_of_their_sequence():
    a = make_seq("a", range(10, 16), blocks=[3, 7])  # whole prompt: 2 prompt rows, then sampling
    b = make_seq("b", range(20, 25), output=[25, 26], blocks=[1, 5])  # decode
    c = make_seq("c", range(30, 40), blocks=[8, 2])  # 2nd chunk of 4: 3 prompt rows
    out = SchedulerOutput(
        (
            ScheduledSequence(a, 0, 6, True, num_prompt_logprobs=2),
            ScheduledSequence(b, 6, 1, True),
            ScheduledSequence(c, 4, 4, False, num_prompt_logprobs=3),
        ),
        (),
        11,
    )
    step = build_step_inputs(out, block_size=4)
    np.testing.assert_array_equal(step.logits_indices, [0, 1, 5, 6, 7, 8, 9])
    assert step.logits_indices.dtype == np.int64
    assert [p.num_logits_rows for p in out.scheduled] == [3, 1, 3]
