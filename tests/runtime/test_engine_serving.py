"""Serving features end to end on a real CPU engine (ONNX Runtime) of a tiny Llama: preemption,
prefix caching, seeds, n > 1, logprobs and prompt logprobs (against HF), startup limits."""

from pathlib import Path

import numpy as np
import pytest

from llmc.errors import EngineConfigError, EngineError, StepFailedError
from llmc.runtime.engine import LLMEngine
from llmc.runtime.engine_config import EngineConfig
from llmc.runtime.sampling_params import SamplingParams
from tests.runtime.test_engine import prompt_of, run

MAX_SEQ_LEN = 64


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory) -> Path:
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from tests.tiny_models import make_tiny_llama

    root = tmp_path_factory.mktemp("serving")
    ckpt = make_tiny_llama(root / "ckpt", sharp=True)
    out = root / "engine"
    build(
        BuildConfig.of(
            model=str(ckpt), block_size=4, max_seq_len=MAX_SEQ_LEN, max_batch=8,
            max_num_tokens=64, output=str(out),
        )
    )  # fmt: skip
    return out


def tokens(seed: int, n: int) -> list[int]:
    """n random non-special token ids."""
    return [int(t) for t in np.random.default_rng(seed).integers(7, 512, size=n)]


def engine(engine_dir, **kw) -> LLMEngine:
    kw.setdefault("num_blocks", 128)
    return LLMEngine.from_engine_dir(engine_dir, threads=1, **kw)


def token_ids(finished: dict, n: int) -> list[list[int]]:
    return [finished[str(i)].outputs[0].token_ids for i in range(n)]


def test_pool_too_small_for_all_running_requests_gives_the_same_greedy_outputs(engine_dir):
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=24)
    arrivals = {0: [(str(i), tokens(40 + i, 20), params) for i in range(6)]}
    reference = run(engine(engine_dir, enable_prefix_caching=False), arrivals)
    # 16 blocks of 4 hold one 64-token sequence; 6 requests of 20 + 24 tokens need 66.
    small = engine(engine_dir, num_blocks=16, max_num_seqs=6)
    finished = run(small, arrivals)
    stats = small.stats()
    assert stats.num_preemptions > 0
    assert token_ids(finished, 6) == token_ids(reference, 6)
    assert all(len(t) == 24 for t in token_ids(finished, 6))
    assert stats.num_free_blocks == stats.num_total_blocks == 16 and stats.kv_cache_usage == 0.0


def test_the_warmup_step_leaves_outputs_and_pool_as_without_it(engine_dir):
    # The warm-up writes keys and values into blocks 0..n-1; requests then get those very
    # blocks, so a kernel or pool that read a stale slot would change the outputs here.
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=16)
    arrivals = {0: [(str(i), tokens(60 + i, 12 + i), params) for i in range(4)]}
    cold = engine(engine_dir, warmup=False)
    warm = engine(engine_dir)
    assert warm.stats().num_free_blocks == warm.stats().num_total_blocks
    # It ran: block 0 of every layer's key cache holds its keys (a new pool is zeros).
    for name, cache in warm.runner.kv_caches.items():
        assert np.abs(cache[0]).max() > 0 and np.abs(cold.runner.kv_caches[name]).max() == 0
    assert token_ids(run(warm, arrivals), 4) == token_ids(run(cold, arrivals), 4)


def test_prefix_cache_hits_give_the_same_outputs_and_count_cached_tokens(engine_dir):
    system = tokens(50, 24)  # 6 full blocks shared by every request
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=8)
    prompts = [system + tokens(60 + i, 5) for i in range(4)]
    arrivals = {i: [(str(i), p, params)] for i, p in enumerate(prompts)}  # one per step
    uncached = engine(engine_dir, enable_prefix_caching=False)
    cached = engine(engine_dir)
    expected, finished = run(uncached, arrivals), run(cached, arrivals)
    assert token_ids(finished, 4) == token_ids(expected, 4)
    assert [finished[str(i)].num_cached_tokens for i in range(4)] == [0, 24, 24, 24]
    stats = cached.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (4 * 29, 3 * 24)
    assert uncached.stats().prefix_cache_queries == 0
    # Admitted in one step, later requests share the blocks the first computes in that step.
    together = run(engine(engine_dir), {0: [a for i in range(4) for a in arrivals[i]]})
    assert token_ids(together, 4) == token_ids(expected, 4)
    assert [together[str(i)].num_cached_tokens for i in range(4)] == [0, 24, 24, 24]
    # A prompt entirely in the cache still computes its last token.
    again = run(cached, {0: [("again", prompts[0], params)]})["again"]
    assert (
        again.num_cached_tokens == 28
        and again.outputs[0].token_ids == expected["0"].outputs[0].token_ids
    )


def test_a_failed_step_aborts_its_requests_and_leaves_no_unwritten_block_in_the_prefix_cache(
    engine_dir,
):
    system = tokens(110, 24)  # 6 full blocks, computed by a first request
    prompt = system + tokens(111, 17)  # then 4 full blocks the failing step is to fill, 1 token
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6)
    expected = run(engine(engine_dir), {0: [("b", prompt, params)]})["b"].outputs[0].token_ids
    eng = engine(engine_dir)
    run(eng, {0: [("warm", system + tokens(112, 3), params)]})
    execute = eng.runner.execute
    calls = []

    def fail_once(step):
        calls.append(len(step.input_ids))
        if len(calls) == 1:
            raise RuntimeError("injected runner failure")
        return execute(step)  # the real runner

    eng.runner.execute = fail_once
    eng.add_request("a", prompt, params)
    eng.add_request("a2", prompt, params)  # admitted with "a": shares the blocks "a" fills
    with pytest.raises(StepFailedError, match="injected runner failure") as failure:
        eng.step()
    assert calls == [17 + 1]  # "a" after its 24 cached tokens, "a2" after a's 40
    assert failure.value.request_ids == ("a", "a2")
    stats = eng.stats()
    assert not eng.has_unfinished_requests() and stats.num_free_blocks == 128

    again = run(eng, {0: [("b", prompt, params)]})["b"]
    assert again.num_cached_tokens == 24  # the first request's blocks, none of the failed step's
    assert again.outputs[0].token_ids == expected
    assert len(calls) > 1  # the real runner ran the later steps


def test_seeded_request_gives_the_same_tokens_alone_and_in_a_mixed_batch(engine_dir):
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    prompt = tokens(70, 12)
    alone = run(engine(engine_dir), {0: [("s", prompt, seeded)]})["s"].outputs[0].token_ids
    others = [
        SamplingParams(temperature=0.0, max_tokens=5),
        SamplingParams(temperature=0.7, top_k=20, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=1.3, seed=7, min_p=0.05, max_tokens=15, ignore_eos=True),
    ]
    arrivals = {
        0: [("o0", prompt_of(71), others[0]), ("o1", prompt_of(72), others[1])],
        1: [("s", prompt, seeded)],
        2: [("o2", prompt_of(73), others[2])],
    }
    mixed = run(engine(engine_dir, seed=99, max_num_batched_tokens=16), arrivals)
    assert mixed["s"].outputs[0].token_ids == alone
    assert len(set(alone)) > 3  # it really sampled


def test_n_completions_share_the_prompt_and_match_single_requests_seeded_seed_plus_i(engine_dir):
    prompt = tokens(80, 18)
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10, ignore_eos=True)
    eng = engine(engine_dir, enable_prefix_caching=False)
    eng.add_request("n3", prompt, params)
    eng.step()  # the prompt: 3 completions forked from its logits row
    parent, *children = eng.scheduler.requests["n3"]
    assert [c.block_ids[:4] for c in children] == [parent.block_ids[:4]] * 2  # 16 of 18 tokens
    assert [eng.scheduler.block_pool.blocks[b].ref_cnt for b in parent.block_ids] == [3] * 4 + [1]
    out = run(eng, {0: []})["n3"]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for i, completion in enumerate(out.outputs):
        single = SamplingParams(temperature=1.0, seed=5 + i, max_tokens=10, ignore_eos=True)
        alone = run(engine(engine_dir), {0: [("one", prompt, single)]})["one"].outputs[0]
        assert completion.token_ids == alone.token_ids
        assert completion.text == alone.text and completion.finish_reason == "length"
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3
    assert eng.stats().num_free_blocks == 128


def test_logprobs_and_prompt_logprobs_match_hf_across_prompt_chunks(engine_dir):
    import torch
    from transformers import AutoModelForCausalLM

    prompt = tokens(90, 21)
    params = SamplingParams(
        temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=3, prompt_logprobs=2
    )
    eng = engine(engine_dir, max_num_batched_tokens=8)  # the prompt runs in 3 chunks
    out = run(eng, {0: [("lp", prompt, params)]})["lp"]
    completion = out.outputs[0]
    all_tokens = prompt + completion.token_ids
    model = AutoModelForCausalLM.from_pretrained(engine_dir.parent / "ckpt").eval()
    with torch.no_grad():
        logits = model(torch.tensor([all_tokens])).logits[0].double()
    reference = torch.log_softmax(logits, dim=-1).numpy()  # [P + 5, V]

    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for t in range(1, len(prompt)):
        entry, ref = out.prompt_logprobs[t], reference[t - 1]
        assert entry[prompt[t]].logprob == pytest.approx(ref[prompt[t]], abs=2e-3)
        assert entry[prompt[t]].rank == int((ref > ref[prompt[t]]).sum()) + 1
        ranked = sorted(entry, key=lambda tok: entry[tok].rank)
        assert ranked[:2] == list(np.argsort(-ref)[:2])
    assert len(completion.logprobs) == 5
    total = 0.0
    for j, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
        ref = reference[len(prompt) - 1 + j]
        assert token == int(ref.argmax()) and entry[token].rank == 1
        assert list(entry)[:1] == [token] and len(entry) == 3  # greedy: the token is the top one
        assert [entry[t].logprob for t in entry] == pytest.approx(np.sort(ref)[::-1][:3], abs=2e-3)
        assert entry[token].decoded_token == eng.tokenizer.decode([token])
        total += entry[token].logprob
    assert completion.cumulative_logprob == pytest.approx(total)


def test_startup_refuses_a_pool_smaller_than_one_max_len_sequence(engine_dir):
    with pytest.raises(
        EngineError, match=r"cannot hold one sequence of max_model_len=64 .*lower --max-model-len"
    ):
        engine(engine_dir, num_blocks=15)
    with pytest.raises(EngineConfigError, match=r"lower max_model_len \(--max-model-len\)"):
        EngineConfig(block_size=4, num_blocks=15, max_model_len=64).scheduler_config()


def test_a_smaller_max_model_len_is_served_from_a_pool_too_small_for_max_seq_len(engine_dir):
    from llmc.engine.manifest import read_manifest
    from llmc.runtime.runners.engine_loader import kv_bytes_per_block

    per_block = kv_bytes_per_block(read_manifest(engine_dir))
    # 8 blocks of 4 tokens hold one 32-token sequence, not one of the build's 64.
    short = engine(engine_dir, num_blocks=None, kv_cache_memory=8 * per_block, max_model_len=32)
    assert (short.config.num_blocks, short.max_model_len) == (8, 32)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12)
    arrivals = {0: [("0", tokens(100, 20), params)]}
    assert token_ids(run(short, arrivals), 1) == token_ids(run(engine(engine_dir), arrivals), 1)
    with pytest.raises(EngineError, match=r"max_model_len=32 \(8 blocks\).*lower --max-model-len"):
        engine(engine_dir, num_blocks=None, kv_cache_memory=7 * per_block, max_model_len=32)


def test_prefill_first_gives_a_burst_the_same_tokens_and_its_first_tokens_sooner(engine_dir):
    # Six 16-token prompts at once, a 16-token budget: prefill first answers prompt i at step
    # i; decodes first also carries the earlier requests' decodes, so the budget splits the
    # later prompts and their first tokens come later. Greedy tokens are the same either way.
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=8)
    first_step, outputs = {}, {}
    for wait in (0, 8):
        eng = engine(engine_dir, max_num_batched_tokens=16, max_decode_wait_steps=wait)
        for i in range(6):
            eng.add_request(str(i), tokens(90 + i, 16), params)
        steps, done = 0, {}
        while eng.has_unfinished_requests():
            steps += 1
            for out in eng.step():
                first_step.setdefault((wait, out.request_id), steps)
                if out.finished:
                    done[out.request_id] = out
        outputs[wait] = token_ids(done, 6)
    assert outputs[8] == outputs[0]
    assert all(len(t) == 8 for t in outputs[8])
    assert [first_step[(8, str(i))] for i in range(6)] == [1, 2, 3, 4, 5, 6]
    assert [first_step[(0, str(i))] for i in range(6)] == [1, 3, 4, 5, 6, 7]
