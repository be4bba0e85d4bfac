"""Sampler: greedy, top-k, top-p, temperature (statistically, fixed seeds), per-request seeds."""

import numpy as np
import pytest
import torch

from llmc.runtime.sampling.sampler import Sampler
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.sequence import Sequence

# A 6-token distribution whose nuclei are easy to work out by hand.
PROBS = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
N = 20_000


def sample_many(params: SamplingParams) -> np.ndarray:
    """N draws from PROBS under ``params``, as one batch of N identical rows."""
    rows = np.tile(np.log(PROBS).astype(np.float32), (N, 1))
    return sample(Sampler(seed=0), rows, [params] * N)


def sample(sampler, logits, params, generators=None) -> np.ndarray:
    """Sample one token per row of ``logits`` for fresh sequences with ``params``."""
    generators = generators or [None] * len(params)
    seqs = [
        Sequence(str(i), [3], p, generator=g)
        for i, (p, g) in enumerate(zip(params, generators, strict=True))
    ]
    return sampler(logits, seqs)


def assert_frequencies(tokens: np.ndarray, expected: np.ndarray) -> None:
    """Each token's frequency within 5 binomial standard deviations of ``expected``."""
    freq = np.bincount(tokens, minlength=len(expected)) / len(tokens)
    sigma = np.sqrt(expected * (1 - expected) / len(tokens))
    assert np.all(np.abs(freq - expected) <= 5 * sigma + 1e-12), (freq, expected)


def random_logits(rows: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, vocab)).astype(np.float32)


def test_greedy_is_argmax():
    logits = random_logits(8, 50, 0)
    params = [SamplingParams(temperature=0.0)] * 8
    out = sample(Sampler(seed=0), logits, params)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.argmax(logits, axis=1))


def test_top_k_1_equals_greedy_and_mixed_batches_keep_greedy_rows_exact():
    logits = random_logits(6, 300, 1)
    params = [
        SamplingParams(top_k=1),
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=1, temperature=5.0),
        SamplingParams(top_k=1, top_p=0.5),
        SamplingParams(temperature=0.0, seed=3),
        SamplingParams(temperature=0.0),
    ]
    out = sample(Sampler(seed=0), logits, params)
    np.testing.assert_array_equal(out, np.argmax(logits, axis=1))


def test_seeded_request_is_reproducible_whatever_the_batch():
    vocab = 400
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=1234)
    others = [
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=5),
        SamplingParams(top_p=0.3, seed=7),
        SamplingParams(),
    ]
    steps = [random_logits(1, vocab, 100 + i)[0] for i in range(20)]

    alone, gen = [], torch.Generator().manual_seed(1234)
    for row in steps:
        alone.append(int(sample(Sampler(seed=0), row[None], [params], [gen])[0]))

    batched, gen = [], torch.Generator().manual_seed(1234)
    sampler = Sampler(seed=99)
    for i, row in enumerate(steps):
        k = i % 5  # the seeded row moves around a batch of 5
        rows = random_logits(5, vocab, 1000 + i)
        rows[k] = row
        ps = others[:k] + [params] + others[k:]
        gens = [torch.Generator().manual_seed(7) if p.seed else None for p in ps]
        gens[k] = gen
        batched.append(int(sample(sampler, rows, ps, gens)[k]))

    assert alone == batched
    assert len(set(alone)) > 5  # it really sampled


def test_different_seeds_give_different_samples():
    logits = np.zeros((1, 1000), np.float32)
    draws = {}
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        p = SamplingParams(seed=seed)
        draws[seed] = [int(sample(Sampler(seed=0), logits, [p], [gen])[0]) for _ in range(10)]
    assert draws[1] != draws[2]


def test_temperature_1_samples_the_softmax():
    assert_frequencies(sample_many(SamplingParams()), PROBS)


def test_temperature_scales_the_logits():
    tempered = PROBS**0.5 / (PROBS**0.5).sum()  # T = 2: softmax(log p / 2)
    assert_frequencies(sample_many(SamplingParams(temperature=2.0)), tempered)


def test_top_k_renormalizes_over_the_k_most_likely():
    expected = np.array([0.4, 0.25, 0.15, 0, 0, 0]) / 0.8
    assert_frequencies(sample_many(SamplingParams(top_k=3)), expected)


@pytest.mark.parametrize(
    ("top_p", "nucleus"),
    [(0.3, 1), (0.6, 2), (0.75, 3), (0.85, 4), (0.99, 6)],
)
def test_top_p_samples_the_smallest_set_reaching_the_mass(top_p, nucleus):
    # Cumulative mass of the sorted tokens: 0.4, 0.65, 0.8, 0.9, 0.96, 1.0.
    expected = np.where(np.arange(6) < nucleus, PROBS, 0.0)
    expected /= expected.sum()
    tokens = sample_many(SamplingParams(top_p=top_p))
    assert tokens.max() < nucleus
    assert_frequencies(tokens, expected)


def test_top_k_and_top_p_together_take_the_smaller_set():
    expected = np.array([0.4, 0.25, 0, 0, 0, 0]) / 0.65
    assert_frequencies(sample_many(SamplingParams(top_k=3, top_p=0.6)), expected)
    assert_frequencies(sample_many(SamplingParams(top_k=2, top_p=0.9)), expected)


def test_top_k_larger_than_the_vocabulary_is_no_limit():
    assert_frequencies(sample_many(SamplingParams(top_k=100)), PROBS)


def test_row_count_mismatch_is_refused():
    with pytest.raises(ValueError, match="2 logits rows but 1 sequences"):
        sample(Sampler(), np.zeros((2, 4), np.float32), [SamplingParams()])


def test_an_extreme_repetition_penalty_keeps_sampling_finite() -> None:
    """A penalty of 5e-324 once made seen tokens' logits +inf, the softmax NaN, and every
    sampled token id 0; the penalized row must stay finite and keep the penalty's order."""
    from llmc.runtime.sampling.penalties import apply_penalties
    from llmc.runtime.sampling_params import SamplingParams
    from llmc.runtime.sequence import Sequence

    for penalty in (5e-324, 1e-30, 1e300):
        params = SamplingParams(temperature=1e-5, repetition_penalty=penalty, max_tokens=4)
        seq = Sequence("r", [3, 5], params)
        logits = np.array([[1.0, -1.0, 2.0, 0.5, 0.0, -0.5]], np.float32)
        apply_penalties(logits, [seq])
        assert np.isfinite(logits).all()
        assert np.isfinite(logits / np.float32(1e-5)).all()
        # Seen tokens 3 (logit 0.5) and 5 (-0.5): a penalty below 1 raises both, above 1 lowers.
        if penalty < 1:
            assert logits[0, 3] > 2.0 and logits[0, 5] > -0.5
        else:
            assert logits[0, 3] < 0.5 and logits[0, 5] < -1.0
