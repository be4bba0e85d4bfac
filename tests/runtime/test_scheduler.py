"""Scheduler with fake model outputs: exact plans, block ids, budgets, preemption, stops."""

import random
from collections import Counter

import pytest

from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.scheduling.scheduler import Scheduler, SchedulerConfig
from llmc.runtime.sequence import Sequence, SequenceStatus

EOS = 1


def make_scheduler(**kw) -> Scheduler:
    # Every make_seq prompt is the same: prefix caching is off unless a test turns it on.
    cfg = dict(max_model_len=64, block_size=4, num_blocks=16, enable_prefix_caching=False)
    cfg.update(kw)
    return Scheduler(SchedulerConfig(**cfg), eos_token_ids={EOS})


def make_seq(request_id: str, num_prompt: int, **params) -> Sequence:
    prompt = [100 + i for i in range(num_prompt)]
    return Sequence(request_id, prompt, SamplingParams(**params))


def plan(out):
    """The plan as (request id, computed tokens, new tokens, samples) tuples."""
    return [
        (s.seq.request_id, s.num_computed_tokens, s.num_new_tokens, s.samples)
        for s in out.scheduled
    ]


def run_step(sched: Scheduler, token: int = 5):
    """One step of a fake model that always samples ``token``."""
    out = sched.schedule()
    sched.update_from_output(out, [token] * len(out.sampling))
    return out


def test_prefill_then_decode_with_exact_blocks():
    sched = make_scheduler()
    seq = make_seq("a", 5)
    sched.add_request(seq)

    out = run_step(sched, token=7)
    assert plan(out) == [("a", 0, 5, True)]
    assert out.num_batched_tokens == 5
    assert seq.block_ids == [0, 1]
    assert seq.output_token_ids == [7]
    assert seq.num_computed_tokens == 5

    for token, blocks in [(8, [0, 1]), (9, [0, 1]), (10, [0, 1]), (11, [0, 1, 2])]:
        out = run_step(sched, token=token)
        assert plan(out) == [("a", seq.num_computed_tokens - 1, 1, True)]
        assert seq.block_ids == blocks
    # 5 prompt + 5 sampled tokens, the last one not computed yet: 9 in the cache.
    assert seq.output_token_ids == [7, 8, 9, 10, 11]
    assert seq.num_computed_tokens == 9
    assert sched.block_pool.num_free_blocks == 13


def test_long_prompt_is_prefilled_in_chunks_and_samples_only_at_its_end():
    sched = make_scheduler(max_num_batched_tokens=8)
    seq = make_seq("a", 20)
    sched.add_request(seq)
    expected = [
        (("a", 0, 8, False), [0, 1]),
        (("a", 8, 8, False), [0, 1, 2, 3]),
        (("a", 16, 4, True), [0, 1, 2, 3, 4]),
        (("a", 20, 1, True), [0, 1, 2, 3, 4, 5]),  # token 21 opens block 6
    ]
    for entry, blocks in expected:
        out = run_step(sched)
        assert plan(out) == [entry]
        assert seq.block_ids == blocks
    assert seq.output_token_ids == [5, 5]


def test_token_budget_is_shared_running_first_then_waiting_in_fcfs_order():
    sched = make_scheduler(max_num_batched_tokens=10)
    for rid in "abc":
        sched.add_request(make_seq(rid, 6))
    out = run_step(sched)
    assert plan(out) == [("a", 0, 6, True), ("b", 0, 4, False)]
    assert out.num_batched_tokens == 10
    out = run_step(sched)
    assert plan(out) == [("a", 6, 1, True), ("b", 4, 2, True), ("c", 0, 6, True)]
    assert out.num_batched_tokens == 9
    out = run_step(sched)
    assert plan(out) == [("a", 7, 1, True), ("b", 6, 1, True), ("c", 6, 1, True)]
    assert [s.block_ids for s in sched.running] == [[0, 1], [2, 3], [4, 5]]


def test_max_num_seqs_bounds_running_and_next_waiting_joins_when_one_finishes():
    sched = make_scheduler(max_num_seqs=2)
    sched.add_request(make_seq("a", 3, max_tokens=2))
    sched.add_request(make_seq("b", 3, max_tokens=5))
    sched.add_request(make_seq("c", 3, max_tokens=5))
    out = run_step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["a", "b"]
    assert sched.num_running_seqs == 2 and sched.num_waiting_seqs == 1
    out = run_step(sched)  # a reaches max_tokens=2 and leaves
    assert [s.seq.request_id for s in out.scheduled] == ["a", "b"]
    out = run_step(sched)
    assert plan(out) == [("b", 4, 1, True), ("c", 0, 3, True)]
    # b's 5th token opens its 2nd block before c is admitted; a's block 0 went to the back of
    # the free queue.
    assert sched.requests["b"][0].block_ids == [1, 2]
    assert sched.requests["c"][0].block_ids == [3]


def test_waiting_request_that_does_not_fit_blocks_later_ones():
    sched = make_scheduler(block_size=2, num_blocks=4, max_model_len=8)
    sched.add_request(make_seq("a", 5))  # 3 blocks
    sched.add_request(make_seq("b", 5))  # 3 blocks: only 1 left
    sched.add_request(make_seq("c", 1))  # would fit, but must not overtake b
    out = sched.schedule()
    assert plan(out) == [("a", 0, 5, True)]
    assert sched.requests["a"][0].block_ids == [0, 1, 2]
    assert [s.request_id for s in sched.waiting] == ["b", "c"]


def test_preemption_by_recompute_of_the_newest_request():
    sched = make_scheduler(block_size=2, num_blocks=4, max_model_len=8)
    a = make_seq("a", 3, max_tokens=4)
    b = make_seq("b", 3, max_tokens=4)
    sched.add_request(a)
    sched.add_request(b)

    out = sched.schedule()
    assert plan(out) == [("a", 0, 3, True), ("b", 0, 3, True)]
    assert (a.block_ids, b.block_ids) == ([0, 1], [2, 3])
    sched.update_from_output(out, [10, 20])
    out = sched.schedule()
    assert plan(out) == [("a", 3, 1, True), ("b", 3, 1, True)]
    sched.update_from_output(out, [11, 21])

    # a's 5th token needs a 3rd block; none is free, so b (admitted last) is preempted.
    out = sched.schedule()
    assert plan(out) == [("a", 4, 1, True)]
    assert out.preempted_request_ids == ("b",)
    assert a.block_ids == [0, 1, 3]  # b's blocks were freed tail first: 3, then 2
    assert b.block_ids == [] and b.num_computed_tokens == 0
    assert b.status is SequenceStatus.WAITING and b.output_token_ids == [20, 21]
    sched.update_from_output(out, [12])

    # b needs 3 blocks to recompute its 5 tokens; one is free: it keeps waiting.
    out = sched.schedule()
    assert plan(out) == [("a", 5, 1, True)]
    sched.update_from_output(out, [13])
    assert a.status is SequenceStatus.FINISHED_LENGTH_CAPPED
    assert a.output_token_ids == [10, 11, 12, 13]

    # b recomputes prompt + its 2 outputs in one chunk and samples its 3rd token.
    out = sched.schedule()
    assert plan(out) == [("b", 0, 5, True)]
    assert b.block_ids == [2, 3, 1]  # free queue after a finished: 2, then a's 3 1 0
    sched.update_from_output(out, [22])
    assert b.output_token_ids == [20, 21, 22]


def test_preempted_requests_go_back_to_the_front_of_waiting_in_arrival_order():
    sched = make_scheduler(block_size=1, num_blocks=6, max_model_len=6)
    sched.add_request(make_seq("a", 2))
    sched.add_request(make_seq("b", 3))
    sched.add_request(make_seq("c", 1))
    sched.add_request(make_seq("d", 1))
    run_step(sched)  # a: [0, 1], b: [2, 3, 4], c: [5]; d waits for a block
    assert [s.request_id for s in sched.waiting] == ["d"]
    # a's next token takes c's block; then b needs one, and being the newest left, preempts
    # itself.
    out = sched.schedule()
    assert plan(out) == [("a", 2, 1, True)]
    assert out.preempted_request_ids == ("c", "b")
    assert [s.request_id for s in sched.waiting] == ["b", "c", "d"]
    assert sched.requests["a"][0].block_ids == [0, 1, 5]


def test_request_that_preempts_itself_is_not_scheduled():
    sched = make_scheduler(block_size=2, num_blocks=2, max_model_len=4)
    sched.add_request(make_seq("a", 1))
    sched.add_request(make_seq("b", 2))
    run_step(sched)  # a: [0] with room for one more token, b: [1] full
    out = sched.schedule()
    assert plan(out) == [("a", 1, 1, True)]
    assert out.preempted_request_ids == ("b",)
    assert sched.block_pool.num_free_blocks == 1


def test_stop_on_eos_stop_token_and_max_tokens_frees_blocks():
    sched = make_scheduler()
    sched.add_request(make_seq("eos", 3))
    sched.add_request(make_seq("ignore", 3, ignore_eos=True, max_tokens=2))
    sched.add_request(make_seq("stop_id", 3, stop_token_ids=[9]))
    out = sched.schedule()
    updated = sched.update_from_output(out, [EOS, EOS, 9])
    assert [s.request_id for s in updated] == ["eos", "ignore", "stop_id"]
    assert [s.finish_reason for s in updated] == ["stop", None, "stop"]
    assert [s.output_token_ids for s in updated] == [[EOS], [EOS], [9]]
    out = run_step(sched, token=EOS)
    assert plan(out) == [("ignore", 3, 1, True)]
    assert out.scheduled[0].seq.finish_reason == "length"
    assert not sched.has_unfinished_requests()
    assert sched.block_pool.num_free_blocks == 16


def test_max_model_len_caps_the_sequence():
    sched = make_scheduler(max_model_len=6)
    seq = make_seq("a", 4, max_tokens=10)  # the engine would refuse it; the cap still holds
    sched.add_request(seq)
    run_step(sched)
    run_step(sched)
    assert seq.num_tokens == 6
    assert seq.status is SequenceStatus.FINISHED_LENGTH_CAPPED


def test_abort_and_finish_request():
    sched = make_scheduler(max_num_seqs=1)
    sched.add_request(make_seq("a", 5))
    sched.add_request(make_seq("b", 5))
    sched.add_request(make_seq("c", 5))
    run_step(sched)
    sched.abort_request("b")  # waiting: dropped when it reaches the front
    sched.abort_request("nope")  # unknown ids are ignored
    assert sched.num_waiting_seqs == 1
    sched.finish_request("a", SequenceStatus.FINISHED_STOPPED)  # e.g. a stop string
    assert sched.block_pool.num_free_blocks == 16
    out = run_step(sched)
    assert plan(out) == [("c", 0, 5, True)]
    sched.abort_request("c")
    assert sched.block_pool.num_free_blocks == 16
    assert not sched.has_unfinished_requests()
    with pytest.raises(ValueError, match="FINISHED"):
        sched.finish_request("c", SequenceStatus.RUNNING)


def test_a_stop_string_ends_the_sequence_and_wins_over_the_length_limit():
    sched = make_scheduler()
    running, last = make_seq("running", 3, max_tokens=5), make_seq("last", 3, max_tokens=1)
    sched.add_request(running)
    sched.add_request(last)
    run_step(sched)
    assert running.status is SequenceStatus.RUNNING and last.finish_reason == "length"
    sched.stop_on_string(running, "ab")
    sched.stop_on_string(last, "cd")  # found in the token that reached max_tokens
    assert [(s.finish_reason, s.stop_reason) for s in (running, last)] == [
        ("stop", "ab"),
        ("stop", "cd"),
    ]
    assert not sched.has_unfinished_requests() and sched.block_pool.num_free_blocks == 16


def test_request_aborted_while_its_step_runs_gets_no_token():
    sched = make_scheduler()
    sched.add_request(make_seq("a", 3))
    sched.add_request(make_seq("b", 3))
    out = sched.schedule()
    sched.abort_request("a")
    updated = sched.update_from_output(out, [7, 8])
    assert [(s.request_id, s.output_token_ids) for s in updated] == [("b", [8])]
    assert sched.requests.keys() == {"b"}


def test_errors():
    sched = make_scheduler()
    sched.add_request(make_seq("a", 3))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(make_seq("a", 3))
    out = sched.schedule()
    with pytest.raises(ValueError, match="expected 1 sampled tokens, got 2"):
        sched.update_from_output(out, [1, 2])
    with pytest.raises(ValueError, match="max_model_len"):
        SchedulerConfig(max_model_len=100, block_size=4, num_blocks=24)
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        SchedulerConfig(max_model_len=8, block_size=4, num_blocks=2, max_num_seqs=0)


@pytest.mark.parametrize("caching", [False, True])
def test_random_workload_keeps_invariants_and_finishes_every_request(caching):
    rng = random.Random(0)
    cfg = SchedulerConfig(
        max_model_len=24,
        block_size=4,
        num_blocks=12,
        max_num_seqs=4,
        max_num_batched_tokens=10,
        enable_prefix_caching=caching,
    )
    sched = Scheduler(cfg, eos_token_ids={EOS})
    pending = [
        make_seq(
            str(i), rng.randint(1, 16), max_tokens=rng.randint(1, 8), n=rng.choice([1, 1, 2, 3])
        )
        for i in range(30)
    ]
    expected_lens = {
        (s.request_id, i): s.params.max_tokens for s in pending for i in range(s.params.n)
    }
    finished = {}
    num_preemptions = 0
    for _ in range(1000):
        if pending and rng.random() < 0.5:
            sched.add_request(pending.pop(0))
        out = sched.schedule()
        num_preemptions += len(out.preempted_request_ids)
        assert out.num_batched_tokens == sum(s.num_new_tokens for s in out.scheduled) <= 10
        assert len(out.scheduled) <= 4 and len(sched.running) <= 4
        assert sum(s.index > 0 for s in sched.running) <= cfg.fork_limit == 2
        assert all(s.seq.status is SequenceStatus.RUNNING for s in out.scheduled)
        # Every live sequence, including completions forked in this step (they join the queues
        # when the step's tokens come back).
        live = [s for seqs in sched.requests.values() for s in seqs]
        live += [f for s in out.scheduled for f in s.forks]
        holders = Counter(b for s in live for b in s.block_ids)
        assert len(holders) == 12 - sched.block_pool.num_free_blocks
        assert {b: sched.block_pool.blocks[b].ref_cnt for b in holders} == holders
        if not caching:  # without the prefix cache, only the completions of a request share
            owners = {}
            for seq in live:
                for b in seq.block_ids:
                    assert owners.setdefault(b, seq.request_id) == seq.request_id
        for s in out.scheduled:
            assert len(s.seq.block_ids) == -(-(s.num_computed_tokens + s.num_new_tokens) // 4)
        tokens = [rng.randint(2, 500) for _ in out.sampling]
        for seq in sched.update_from_output(out, tokens):
            if seq.is_finished:
                assert seq.key not in finished
                finished[seq.key] = seq
        if not pending and not sched.has_unfinished_requests():
            break
    assert len(finished) == len(expected_lens) > 30
    assert {k: s.num_output_tokens for k, s in finished.items()} == expected_lens
    if caching:  # every prompt is a prefix of 100, 101, 102...: most blocks are shared
        stats = sched.stats()
        assert 0 < stats.prefix_cache_hits < stats.prefix_cache_queries
    else:
        assert num_preemptions > 0  # the pool is small enough to exercise preemption
    assert sched.block_pool.num_free_blocks == 12


# ---- prefix caching, forks, prompt logprobs -------------------------------------------------


def test_second_request_starts_after_the_cached_prefix_and_counts_hits():
    sched = make_scheduler(enable_prefix_caching=True)
    a = make_seq("a", 10)
    sched.add_request(a)
    run_step(sched)
    b = make_seq("b", 10)
    sched.add_request(b)
    out = run_step(sched)
    assert plan(out) == [("a", 10, 1, True), ("b", 8, 2, True)]
    assert b.block_ids[:2] == a.block_ids[:2] == [0, 1] and b.block_ids[2] not in a.block_ids
    assert b.num_cached_tokens == 8
    stats = sched.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (20, 8)


def test_requests_admitted_in_the_same_step_share_blocks_computed_in_that_step():
    sched = make_scheduler(enable_prefix_caching=True)
    sched.add_request(make_seq("a", 9))
    sched.add_request(make_seq("b", 9))
    out = run_step(sched)
    assert plan(out) == [("a", 0, 9, True), ("b", 8, 1, True)]
    assert sched.requests["b"][0].block_ids == [0, 1, 3]


def test_n_completions_fork_after_the_prompt_and_share_its_full_blocks():
    sched = make_scheduler()
    sched.add_request(make_seq("a", 10, n=3, max_tokens=3))
    out = sched.schedule()
    assert plan(out) == [("a", 0, 10, True)]
    assert [s.index for s in out.sampling] == [0, 1, 2]
    sched.update_from_output(out, [7, 8, 9])
    parent, c1, c2 = sched.requests["a"]
    assert [s.output_token_ids for s in (parent, c1, c2)] == [[7], [8], [9]]
    assert [s.request_id for s in sched.waiting.forks] == ["a", "a"]
    assert [b.ref_cnt for b in sched.block_pool.blocks[:3]] == [3, 3, 1]
    out = run_step(sched)
    # The parent decodes; each child recomputes the 2 prompt tokens past the shared blocks and
    # its own first token.
    assert plan(out) == [("a", 10, 1, True), ("a", 8, 3, True), ("a", 8, 3, True)]
    assert (parent.block_ids, c1.block_ids, c2.block_ids) == ([0, 1, 2], [0, 1, 3], [0, 1, 4])
    run_step(sched)
    assert not sched.has_unfinished_requests()
    assert sched.block_pool.num_free_blocks == 16


def test_a_failed_step_uncaches_the_blocks_it_was_to_fill_and_aborts_its_requests():
    sched = make_scheduler(enable_prefix_caching=True)
    sched.add_request(make_seq("a", 9, max_tokens=10))
    run_step(sched)  # a's blocks 0 and 1 are full and cached, 2 holds 1 token
    sched.add_request(make_seq("b", 13, n=2))
    sched.add_request(make_seq("c", 13))
    out = sched.schedule()  # the step that fails
    assert plan(out) == [("a", 9, 1, True), ("b", 8, 5, True), ("c", 12, 1, True)]
    b, c = sched.requests["b"][0], sched.requests["c"][0]
    # b fills block 3 and c shares it in the same step, as does b's forked completion.
    assert (b.block_ids, c.block_ids, out.scheduled[1].forks[0].block_ids) == (
        [0, 1, 3, 4], [0, 1, 3, 5], [0, 1, 3]
    )  # fmt: skip
    assert sched.block_pool.get_cached_block(b.block_hashes[2]) == 3

    assert sched.fail_step(out) == ("a", "b", "c")
    assert not sched.has_unfinished_requests() and not sched.running
    pool = sched.block_pool
    assert pool.num_free_blocks == 16 and pool.get_cached_block(b.block_hashes[2]) is None
    assert [pool.get_cached_block(h) for h in b.block_hashes[:2]] == [0, 1]  # earlier steps'
    d = make_seq("d", 13)
    sched.add_request(d)
    assert plan(run_step(sched)) == [("d", 8, 5, True)]  # only blocks 0 and 1 hit
    assert d.block_ids[:2] == [0, 1] and 3 not in d.block_ids


def test_prompt_logprob_rows_cover_every_prompt_position_once_across_chunks():
    sched = make_scheduler(max_num_batched_tokens=4)
    sched.add_request(make_seq("a", 10, prompt_logprobs=2))
    rows = []
    for _ in range(3):
        out = run_step(sched)
        (p,) = out.scheduled
        rows.append((p.num_computed_tokens, p.num_prompt_logprobs, p.num_logits_rows))
    # Positions 0..8 predict prompt tokens 1..9; position 9 samples the first output token.
    assert rows == [(0, 4, 4), (4, 4, 4), (8, 1, 2)]
    out = run_step(sched)
    assert out.scheduled[0].num_prompt_logprobs == 0  # decodes have none


def test_decodes_are_scheduled_before_a_running_prompt_chunk():
    # b is admitted after a but decodes; a is being recomputed after a preemption.
    sched = make_scheduler(max_num_batched_tokens=6, num_blocks=5, max_model_len=20)
    a, b = make_seq("a", 8), make_seq("b", 3)
    sched.add_request(a)
    run_step(sched)  # a: 8 prompt tokens, blocks [0, 1]
    sched.add_request(b)
    run_step(sched)  # a decodes; b prefills (block 2)
    a.num_computed_tokens = 0  # as after a preemption: a has 10 tokens to recompute
    sched.kv_cache_manager.free(a)
    out = run_step(sched)
    assert plan(out) == [("b", 3, 1, True), ("a", 0, 5, False)]


# ---- fairness: forks hold at most max_num_forked_seqs slots -----------------------------


def start_n128(sched: Scheduler, num_steps: int) -> Sequence:
    """Add a request of n = 128 completions of 40 tokens and run ``num_steps`` steps."""
    big = make_seq("big", 4, n=128, max_tokens=40)
    sched.add_request(big)
    for _ in range(num_steps):
        run_step(sched)
    return big


def test_a_new_request_is_scheduled_in_the_step_after_it_arrives_while_n128_runs():
    # max_num_seqs 8: forks hold at most 4 slots (the default, half), the parent one more.
    sched = make_scheduler(max_num_seqs=8, num_blocks=128)
    start_n128(sched, 10)
    assert [(s.request_id, s.index) for s in sched.running] == [("big", i) for i in range(5)]
    assert len(sched.waiting.forks) == 123
    q = make_seq("q", 4, max_tokens=4)
    sched.add_request(q)
    out = run_step(sched)
    # Bound: the next step (max_num_seqs >= 4 + 2, budget > 4 + 1, blocks free).
    assert plan(out) == [("big", 13, 1, True)] * 5 + [("q", 0, 4, True)]
    for _ in range(3):
        run_step(sched)
    assert q.status is SequenceStatus.FINISHED_LENGTH_CAPPED and len(sched.running) == 5


def test_without_the_cap_the_new_request_waits_for_all_128_completions_to_start():
    sched = make_scheduler(max_num_seqs=8, num_blocks=128, max_num_forked_seqs=8)
    start_n128(sched, 10)
    assert len(sched.running) == 8
    q = make_seq("q", 4, max_tokens=4)
    sched.add_request(q)
    num_steps = 0
    while q.num_output_tokens == 0:
        run_step(sched)
        num_steps += 1
    # 128 completions 8 at a time: after the prompt's step, 16 rounds of 39 steps; q arrived
    # after step 10 and starts in the step after the last round.
    assert not sched.waiting.forks and num_steps == 1 + 16 * 39 + 1 - 10


def test_every_completion_of_the_n128_request_still_finishes_beside_new_requests():
    sched = make_scheduler(max_num_seqs=8, num_blocks=128)
    big = start_n128(sched, 0)
    others = []
    for step in range(2000):
        if step % 7 == 0 and len(others) < 100:
            others.append(make_seq(f"q{step}", 4, max_tokens=4))
            sched.add_request(others[-1])
        out = run_step(sched)
        assert sum(s.seq.index > 0 for s in out.scheduled) <= 4
        assert not sched.waiting.firsts  # every new request started in the step it arrived
        if not sched.has_unfinished_requests():
            break
    assert step < 2000 and len(others) == 100
    assert all(q.status is SequenceStatus.FINISHED_LENGTH_CAPPED for q in others)
    assert big.num_output_tokens == 40  # and its 127 forks: every completion left its blocks
    assert sched.block_pool.num_free_blocks == 128


def test_a_fork_held_back_by_the_cap_does_not_hold_back_a_new_request():
    sched = make_scheduler(max_num_seqs=4, max_num_forked_seqs=1)
    sched.add_request(make_seq("a", 4, n=3, max_tokens=4))
    run_step(sched)
    sched.add_request(make_seq("b", 1, max_tokens=4))
    out = run_step(sched)
    # One fork runs (the cap); the other waits, and b, which came later, starts.
    assert plan(out) == [("a", 4, 1, True), ("a", 4, 1, True), ("b", 0, 1, True)]
    assert [(s.seq.index) for s in out.scheduled] == [0, 1, 0]
    assert [s.index for s in sched.waiting.forks] == [2]


def test_fork_limit_defaults_to_half_of_max_num_seqs():
    cfg = dict(max_model_len=8, block_size=4, num_blocks=2)
    limits = [SchedulerConfig(**cfg, max_num_seqs=m).fork_limit for m in (1, 2, 5, 16)]
    assert limits == [1, 1, 2, 8]
    assert SchedulerConfig(**cfg, max_num_forked_seqs=3).fork_limit == 3
    with pytest.raises(ValueError, match="max_num_forked_seqs must be >= 1"):
        SchedulerConfig(**cfg, max_num_forked_seqs=0)


def test_prefill_first_gives_a_burst_its_first_tokens_one_prompt_per_step():
    # Four 8-token prompts at once, budget 8: each step prefills one prompt and the decodes
    # wait; with decodes first, step i would also carry i - 1 decodes and split the prompts.
    sched = make_scheduler(max_num_batched_tokens=8, max_decode_wait_steps=4, num_blocks=32)
    for rid in "abcd":
        sched.add_request(make_seq(rid, 8, max_tokens=4))
    for rid in "abcd":
        assert plan(run_step(sched)) == [(rid, 0, 8, True)]
    assert plan(run_step(sched)) == [(r, 8, 1, True) for r in "abcd"]


def test_decodes_first_splits_the_same_burst():
    sched = make_scheduler(max_num_batched_tokens=8, num_blocks=32)
    for rid in "abcd":
        sched.add_request(make_seq(rid, 8, max_tokens=4))
    assert plan(run_step(sched)) == [("a", 0, 8, True)]
    assert plan(run_step(sched)) == [("a", 8, 1, True), ("b", 0, 7, False)]


def test_prefill_first_makes_decodes_wait_at_most_the_bound():
    # Prompts keep arriving (eight waiting), bound 2: a running sequence's decode waits two
    # steps, then runs first in the third, which fills its budget with the next prompt's chunk.
    sched = make_scheduler(max_num_batched_tokens=8, max_decode_wait_steps=2, num_blocks=64)
    for rid in "abcdefgh":
        sched.add_request(make_seq(rid, 8, max_tokens=8))
    assert plan(run_step(sched)) == [("a", 0, 8, True)]
    assert plan(run_step(sched)) == [("b", 0, 8, True)]
    assert plan(run_step(sched)) == [("c", 0, 8, True)]
    assert plan(run_step(sched)) == [
        ("a", 8, 1, True), ("b", 8, 1, True), ("c", 8, 1, True), ("d", 0, 5, False),
    ]  # fmt: skip
    assert plan(run_step(sched)) == [("d", 5, 3, True), ("e", 0, 5, False)]
    assert plan(run_step(sched)) == [("e", 5, 3, True), ("f", 0, 5, False)]
    # To the end of the run: no sequence ready to decode waits more than two steps in a row.
    waited: Counter = Counter()
    while sched.has_unfinished_requests():
        ready = {s.request_id for s in sched.running if s.num_tokens - s.num_computed_tokens == 1}
        scheduled = {entry[0] for entry in plan(run_step(sched))}
        for rid in ready:
            waited[rid] = 0 if rid in scheduled else waited[rid] + 1
            assert waited[rid] <= 2, rid


def test_prefill_first_runs_the_decodes_when_no_prompt_fits_the_pool():
    # The pool holds the running sequence and not the next prompt: the step decodes instead of
    # doing nothing, so the waiting prompt gets blocks when the first one finishes.
    sched = make_scheduler(max_num_batched_tokens=12, max_decode_wait_steps=8, num_blocks=4,
                           max_model_len=16)  # fmt: skip
    sched.add_request(make_seq("a", 12, max_tokens=2))
    sched.add_request(make_seq("b", 8, max_tokens=1))
    assert plan(run_step(sched)) == [("a", 0, 12, True)]
    assert plan(run_step(sched)) == [("a", 12, 1, True)]  # b needs 2 blocks, 1 is free
    assert plan(run_step(sched)) == [("b", 0, 8, True)]


def test_max_decode_wait_steps_below_zero_is_refused():
    with pytest.raises(Exception, match="max_decode_wait_steps must be >= 0"):
        make_scheduler(max_decode_wait_steps=-1)
