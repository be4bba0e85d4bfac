"""Speculative decoding: the n-gram proposer, the rules, the greedy check, and end to end on
tiny engines through the real ONNX Runtime: greedy outputs with speculation (n-gram, a draft
model that agrees, one that mostly does not) equal those without, alone, in a mixed batch and
under preemption."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmc.runtime.llm import LLM
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.sequence import Sequence
from llmc.runtime.spec_decode.ngram_proposer import NgramProposer
from llmc.runtime.spec_decode.rules import num_drafts_allowed, verify_greedy
from llmc.runtime.spec_decode.speculative_config import SpeculativeConfig

PROMPTS = [
    "To be, or not to be, that is the question: to be, or not to be",
    "ROMEO: ROMEO: ROMEO:",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "the the the the the",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def test_ngram_proposes_what_followed_the_latest_earlier_occurrence():
    proposer = NgramProposer(prompt_lookup_min=1, prompt_lookup_max=3)
    #                 0  1  2  3  4  5  6  7  8  9
    assert proposer.propose([5, 6, 7, 8, 1, 5, 6, 7, 9, 5, 6, 7], 2) == [9, 5]  # latest "5 6 7"
    assert proposer.propose([1, 2, 3, 4, 2, 3], 5) == [4, 2, 3]  # "2 3" -> what followed
    assert proposer.propose([1, 2, 3, 4], 3) == []  # "4" never occurred before
    assert proposer.propose([7, 7], 4) == [7]  # the match may run into the suffix
    assert proposer.propose([1, 2, 1], 0) == []
    # The longest suffix first: "9 1" recurs at 0 (-> 4), "1" alone more recently (-> 8).
    assert NgramProposer(1, 2).propose([9, 1, 4, 1, 8, 9, 1], 1) == [4]
    assert NgramProposer(1, 1).propose([9, 1, 4, 1, 8, 9, 1], 1) == [8]


def test_which_sequences_may_speculate_and_how_far():
    def decoding(params: SamplingParams, num_out: int = 3) -> Sequence:
        seq = Sequence("r", [1, 2, 3], params)
        seq.output_token_ids = [4] * num_out
        seq.num_computed_tokens = seq.num_tokens - 1
        return seq

    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    assert num_drafts_allowed(decoding(greedy), 4, 100) == 4
    assert num_drafts_allowed(decoding(greedy, num_out=8), 4, 100) == 1  # max_tokens: 10
    assert num_drafts_allowed(decoding(greedy), 4, 8) == 2  # max_model_len: positions 6, 7
    assert num_drafts_allowed(decoding(SamplingParams(temperature=0.7, max_tokens=10)), 4, 99)
    for params in (
        SamplingParams(temperature=0.0, max_tokens=10, logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=10, repetition_penalty=1.2),
        SamplingParams(temperature=0.0, max_tokens=10, min_tokens=5),
    ):
        assert num_drafts_allowed(decoding(params), 4, 100) == 0, params
    prefill = Sequence("r", [1, 2, 3], greedy)
    assert num_drafts_allowed(prefill, 4, 100) == 0


def test_verify_greedy_accepts_the_agreeing_drafts_then_the_targets_token():
    rows = np.full((4, 10), -1.0, np.float32)
    for i, best in enumerate([3, 5, 7, 9]):
        rows[i, best] = 1.0
    assert verify_greedy(rows, [3, 5, 7]) == [3, 5, 7, 9]  # all agree: k + 1 tokens
    assert verify_greedy(rows, [3, 6, 7]) == [3, 5]  # the second disagrees
    assert verify_greedy(rows, [4, 5, 7]) == [3]  # none: the target's own token


@pytest.mark.parametrize(
    "values",
    [
        {"method": "beam", "num_speculative_tokens": 2},
        {"method": "ngram", "num_speculative_tokens": 0},
        {"method": "ngram"},
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3,
         "prompt_lookup_max": 2},
        {"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1},
        {"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0},
    ],
)  # fmt: skip
def test_bad_speculative_configs_are_refused(values):
    with pytest.raises(ValueError):
        SpeculativeConfig.from_dict(values)


def _texts(llm: LLM, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.fixture(scope="module")
def reference(tiny_llama_engine: Path) -> list[list[int]]:
    return _texts(LLM(tiny_llama_engine, seed=0), GREEDY)


@pytest.mark.parametrize("k", [1, 4])
def test_ngram_greedy_output_equals_plain_greedy(tiny_llama_engine, reference, k):
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3}
    llm = LLM(tiny_llama_engine, seed=0, speculative_config=spec)
    assert _texts(llm, GREEDY) == reference
    stats = llm.engine.stats()
    assert stats.spec_decode_num_draft_tokens > 0
    assert 0 < stats.spec_decode_num_accepted_tokens <= stats.spec_decode_num_draft_tokens


def test_a_draft_model_that_agrees_is_accepted_and_changes_nothing(tiny_llama_engine, reference):
    spec = {"method": "draft", "num_speculative_tokens": 3, "model": str(tiny_llama_engine)}
    llm = LLM(tiny_llama_engine, seed=0, speculative_config=spec)
    assert _texts(llm, GREEDY) == reference
    stats = llm.engine.stats()
    # The same engine drafts: every draft is the target's own greedy token.
    assert stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens > 0


@pytest.fixture(scope="module")
def other_engine(tmp_path_factory) -> Path:
    """A tiny Llama with other random weights: a draft the target mostly rejects."""
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from tests.conftest import TINY_MAX_SEQ_LEN
    from tests.tiny_models import make_tiny_llama

    root = tmp_path_factory.mktemp("other")
    ckpt = make_tiny_llama(root / "ckpt", seed=7)
    config = BuildConfig.of(model=str(ckpt), block_size=16, max_seq_len=TINY_MAX_SEQ_LEN,
                            output=str(root / "engine"))  # fmt: skip
    return Path(build(config).engine_dir)


def test_a_draft_model_that_disagrees_still_gives_the_targets_output(
    tiny_llama_engine, other_engine, reference
):
    spec = {"method": "draft", "num_speculative_tokens": 4, "model": str(other_engine)}
    llm = LLM(tiny_llama_engine, seed=0, speculative_config=spec)
    assert _texts(llm, GREEDY) == reference
    stats = llm.engine.stats()
    assert stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens


def test_mixed_batch_with_sampling_requests_and_preemption(tiny_llama_engine, reference):
    """Greedy requests speculate beside sampling ones (which speculate by rejection sampling)
    and a logprobs one (which does not); a pool too small for all of them preempts and
    recomputes; the greedy outputs equal those without speculation, the others run to their
    length."""
    sampled = SamplingParams(temperature=0.9, seed=11, max_tokens=40, ignore_eos=True)
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=2)
    params = [GREEDY, sampled, GREEDY, with_logprobs]
    plain = LLM(tiny_llama_engine, seed=0, num_blocks=9)
    expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, params)]
    assert [expected[0], expected[2], expected[3]] == [reference[0], reference[2], reference[3]]
    for spec in (
        {"method": "ngram", "num_speculative_tokens": 3},
        {"method": "draft", "num_speculative_tokens": 2, "model": str(tiny_llama_engine)},
    ):
        llm = LLM(tiny_llama_engine, seed=0, num_blocks=9, speculative_config=spec)
        got = llm.generate(PROMPTS, params)
        ids = [o.outputs[0].token_ids for o in got]
        assert [ids[0], ids[2], ids[3]] == [expected[0], expected[2], expected[3]], spec
        assert len(ids[1]) == 40 and len(got[3].outputs[0].logprobs) == 40
        assert llm.engine.stats().num_preemptions > 0
        assert llm.engine.stats().spec_decode_num_drafts > 0


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_rejection_sampling_keeps_the_targets_distribution():
    """verify_sampled on fixed rows: the first token is distributed as row 0, the second (given
    the first draft was accepted) as row 1, for a likely and an unlikely draft. Chi-square
    against the rows, 6 categories (5 degrees of freedom: 20.5 is the 0.001 quantile)."""
    import torch

    from llmc.runtime.spec_decode.rules import verify_sampled

    probs = torch.tensor(
        [[0.05, 0.4, 0.1, 0.2, 0.15, 0.1], [0.3, 0.1, 0.1, 0.2, 0.2, 0.1], [1 / 6] * 6]
    )
    generator = torch.Generator().manual_seed(0)
    for drafts in ([1, 0], [0, 5]):  # draft 1 is likely under row 0, draft 0 unlikely
        first, second = np.zeros(6), np.zeros(6)
        for _ in range(20000):
            tokens = verify_sampled(probs, drafts, generator)
            first[tokens[0]] += 1
            if tokens[0] == drafts[0]:
                second[tokens[1]] += 1
        assert _chi_square(first, probs[0].numpy()) < 20.5, (drafts, first)
        assert _chi_square(second, probs[1].numpy()) < 20.5, (drafts, second)


def test_speculative_sampling_on_a_tiny_model_matches_the_targets_distribution(tiny_llama_engine):
    """The first two tokens of a prompt, sampled at temperature 1 with top-k 3, with a draft
    model (the second token is verified against its draft): their 9 joint outcomes
    are distributed as the target's p(t1) p(t2 | t1), read from the plain engine's logprobs.
    Chi-square, 8 degrees of freedom (26.1 is the 0.001 quantile)."""
    prompt = PROMPTS[3]
    plain = LLM(tiny_llama_engine, seed=0)
    top = SamplingParams(temperature=0.0, max_tokens=1, logprobs=3)

    def top3(prompt_ids: list[int]) -> dict[int, float]:
        (entry,) = plain.generate({"prompt_token_ids": prompt_ids}, top)[0].outputs[0].logprobs
        best = sorted(entry.items(), key=lambda kv: -kv[1].logprob)[:3]
        weights = np.exp([lp.logprob for _, lp in best])
        return {t: w / weights.sum() for (t, _), w in zip(best, weights, strict=True)}

    prompt_ids = plain.engine.tokenizer.encode(prompt)
    joint = {
        (t1, t2): p1 * p2
        for t1, p1 in top3(prompt_ids).items()
        for t2, p2 in top3([*prompt_ids, t1]).items()
    }
    # A draft model always drafts (its argmax: accepted with probability p(argmax)).
    spec = {"method": "draft", "num_speculative_tokens": 1, "model": str(tiny_llama_engine),
            "disable_by_batch_size": 64}  # fmt: skip
    llm = LLM(tiny_llama_engine, seed=0, speculative_config=spec)
    # max_tokens 3: the step after t1 drafts the token after it (room for a bonus token)
    params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True, seed=s)
              for s in range(1500)]  # fmt: skip
    outs = llm.generate([prompt] * len(params), params)
    counts = dict.fromkeys(joint, 0)
    for out in outs:
        counts[tuple(out.outputs[0].token_ids[:2])] += 1
    assert llm.engine.stats().spec_decode_num_draft_tokens > 0
    keys = sorted(joint)
    chi2 = _chi_square(
        np.array([counts[k] for k in keys], float), np.array([joint[k] for k in keys])
    )
    assert chi2 < 26.1, (counts, joint)


def test_stops_inside_accepted_drafts_end_the_output_where_plain_decoding_does(
    tiny_llama_engine,
):
    """A stop string or max_tokens reached in the middle of a step's accepted tokens ends the
    output there, as without speculation."""
    plain = LLM(tiny_llama_engine, seed=0)
    text = plain.generate(PROMPTS[3], GREEDY)[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    for params in (
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop]),
        SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
    ):
        want = plain.generate(PROMPTS, params)
        spec = {"method": "draft", "num_speculative_tokens": 4, "model": str(tiny_llama_engine)}
        got = LLM(tiny_llama_engine, seed=0, speculative_config=spec).generate(PROMPTS, params)
        for a, b in zip(got, want, strict=True):
            assert (a.outputs[0].text, a.outputs[0].token_ids, a.outputs[0].finish_reason) == (
                b.outputs[0].text,
                b.outputs[0].token_ids,
                b.outputs[0].finish_reason,
            )


def test_the_server_speculates_and_reports_vllms_metrics(tiny_llama_engine, running_server):
    """The real server with n-gram speculation: outputs equal plain greedy's, /metrics counts
    the drafts, and ``llmc bench`` reports them; a bad ``--speculative-config`` is refused."""
    from llmc.bench.config import BenchConfig
    from llmc.bench.runner import run_bench
    from llmc.errors import EngineConfigError
    from llmc.runtime.engine import LLMEngine
    from llmc.runtime.server.serve_config import EngineLimits

    spec = EngineLimits(speculative_config='{"method": "ngram", "num_speculative_tokens": 3}')
    engine = LLMEngine.from_engine_dir(tiny_llama_engine, seed=0,
                                       speculative_config=spec.speculative)  # fmt: skip
    with running_server(engine, "tiny") as server:
        import httpx

        body = {"model": "tiny", "prompt": PROMPTS[3], "max_tokens": 40, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        text = httpx.post(server.url + "/v1/completions", json=body).json()["choices"][0]["text"]
        plain = LLM(tiny_llama_engine, seed=0).generate(PROMPTS[3], GREEDY)[0].outputs[0].text
        assert text == plain
        metrics = httpx.get(server.url + "/metrics").text
        drafted = [line for line in metrics.splitlines()
                   if line.startswith("vllm:spec_decode_num_draft_tokens_total")]  # fmt: skip
        assert drafted and float(drafted[0].split()[-1]) > 0
        run = run_bench(BenchConfig(base_url=server.url, model="tiny", num_prompts=4,
                                    input_len=8, output_len=24, temperature=0.0,
                                    ignore_eos=True))  # fmt: skip
        assert run.spec_decode is not None and run.spec_decode.num_draft_tokens > 0
        assert 0 <= run.spec_decode.acceptance_rate <= 1
    for bad in ('{"method": "ngram"}', "[1]", "not json"):
        with pytest.raises(EngineConfigError, match="speculative_config"):
            EngineLimits(speculative_config=bad)


def test_speculation_turns_itself_off_in_wide_steps(tiny_llama_engine, reference):
    """More running requests than disable_by_batch_size: no step drafts (the output is the same
    either way); the measured default applies when the key is absent."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 3}
    llm = LLM(tiny_llama_engine, seed=0, speculative_config=spec)
    assert _texts(llm, GREEDY) == reference  # 4 requests run at once until the first ends
    wide = llm.engine.stats().spec_decode_num_drafts
    assert SpeculativeConfig("draft", 2).max_batch_size == 4
    assert SpeculativeConfig("ngram", 2, disable_by_batch_size=100).max_batch_size == 100
    alone = LLM(tiny_llama_engine, seed=0, speculative_config=spec)
    for prompt in PROMPTS:  # one at a time: every decode step may draft
        alone.generate(prompt, GREEDY)
    assert alone.engine.stats().spec_decode_num_drafts > wide


def test_build_with_a_draft_serves_it_and_refuses_a_tampered_one(
    tiny_llama_dir, tmp_path, reference
):
    """`llmc build --draft int8`: the engine directory holds its int8 draft, the manifest
    records it with its digest, ``{"method": "draft"}`` without a model takes it (greedy output
    unchanged), also from a registry's checkout of the engine, and a draft whose manifest
    changed is refused before it loads."""
    import shutil

    from llmc.cli import main
    from llmc.engine.manifest import read_manifest
    from llmc.errors import EngineConfigError, EngineCorruptError
    from tests.conftest import TINY_MAX_SEQ_LEN

    out = tmp_path / "engine"
    args = ["build", str(tiny_llama_dir), "--block-size", "16", "--max-seq-len",
            str(TINY_MAX_SEQ_LEN), "--draft", "int8", "-o", str(out)]  # fmt: skip
    assert main(args) == 0
    record = read_manifest(out).draft
    assert record["path"] == "draft" and record["quant"] == "int8"
    assert 0 < record["accuracy_report"]["top1_agreement"] <= 1
    assert read_manifest(out / "draft").quant == "int8"
    spec = {"method": "draft", "num_speculative_tokens": 3}
    llm = LLM(out, seed=0, speculative_config=spec)
    assert _texts(llm, GREEDY) == reference
    assert llm.engine.stats().spec_decode_num_draft_tokens > 0
    # published to a registry and checked out, the engine keeps its draft
    from llmc.registry.local import LocalRegistry

    registry = LocalRegistry(tmp_path / "registry")
    checkout = registry.checkout(registry.publish(out))
    served = LLM(checkout, seed=0, speculative_config=spec)
    assert _texts(served, GREEDY) == reference
    assert served.engine.stats().spec_decode_num_draft_tokens > 0

    manifest = out / "draft" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"int8"', '"int8" ', 1))
    with pytest.raises(EngineCorruptError):
        LLM(out, speculative_config=spec)
    shutil.rmtree(out / "draft")
    plain = tmp_path / "plain"
    shutil.copytree(out, plain)
    data = read_manifest(plain)
    from dataclasses import replace

    from llmc.engine.manifest import write_manifest

    write_manifest(replace(data, draft=None), plain)
    with pytest.raises(EngineConfigError, match="--draft"):
        LLM(plain, speculative_config=spec)


@pytest.fixture(scope="module")
def tiny_gemma3_engines(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny Gemma 3 engines (a sliding layer of window 8 and a global one), seeds 0 and 5."""
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from tests.conftest import TINY_MAX_SEQ_LEN
    from tests.tiny_models import make_tiny_gemma3

    engines = []
    for seed in (0, 5):
        root = tmp_path_factory.mktemp(f"gemma3_seed{seed}")
        ckpt = make_tiny_gemma3(root / "ckpt", seed=seed)
        config = BuildConfig.of(model=str(ckpt), block_size=16, max_seq_len=TINY_MAX_SEQ_LEN,
                                output=str(root / "engine"))  # fmt: skip
        engines.append(Path(build(config).engine_dir))
    return engines[0], engines[1]


def test_draft_speculation_over_a_sliding_window_layer_changes_nothing(tiny_gemma3_engines):
    """Gemma 3's sliding layer (window 8, shorter than every prompt plus its 40 tokens): with a
    draft that agrees (the engine itself: every draft accepted) and one that mostly does not
    (other weights), whose rejected tokens' cache slots the window then covers, all four prompts
    at once give the greedy tokens generated without speculation."""
    target, other = tiny_gemma3_engines
    plain = _texts(LLM(target, seed=0), GREEDY)
    for draft, all_accepted in ((target, True), (other, False)):
        spec = {"method": "draft", "num_speculative_tokens": 3, "model": str(draft)}
        llm = LLM(target, seed=0, speculative_config=spec)
        assert _texts(llm, GREEDY) == plain, draft
        stats = llm.engine.stats()
        assert stats.spec_decode_num_draft_tokens > 0
        accepted_all = stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens
        assert accepted_all == all_accepted
