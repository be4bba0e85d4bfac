"""Inverse-transform categorical draws against a one-level float64 cumulative sum, masked tokens
at block edges, and frequencies over a vocabulary of several blocks."""

import numpy as np
import pytest

from llmc.runtime.sampling.categorical import BLOCK, sample_categorical


def reference(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """The textbook inverse transform: np.searchsorted on the whole row's float64 cumsum."""
    out = []
    for row, u in zip(probs, uniforms, strict=True):
        cum = np.cumsum(row.astype(np.float64))
        out.append(int(np.searchsorted(cum, u * cum[-1], side="right")))
    return np.array(out)


@pytest.mark.parametrize("vocab", [7, BLOCK, 3 * BLOCK + 5, 262_144])
def test_draws_equal_the_one_level_inverse_transform(vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.normal(scale=3.0, size=(12, vocab))
    probs = np.exp(logits - logits.max(axis=1, keepdims=True)).astype(np.float32)
    uniforms = np.concatenate([[0.0, 1.0 - 2.0**-53], rng.random(10)])
    out = sample_categorical(probs, uniforms)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, reference(probs, uniforms))


def test_a_masked_token_is_never_drawn_even_at_a_boundary():
    vocab = 3 * BLOCK + 17
    kept = [0, BLOCK - 1, BLOCK, 2 * BLOCK + 3, vocab - 1]
    probs = np.zeros((1, vocab), np.float32)
    probs[0, kept] = [0.125, 0.25, 0.125, 0.25, 0.25]  # sums exact in binary
    edges = np.cumsum([0.0, 0.125, 0.25, 0.125, 0.25])  # u at each token's first value
    uniforms = np.concatenate([edges, edges[1:] - 2.0**-40, [1.0 - 2.0**-53]])
    rows = np.repeat(probs, len(uniforms), axis=0)
    out = sample_categorical(rows, uniforms)
    assert set(out.tolist()) <= set(kept)
    assert out[: len(kept)].tolist() == kept  # u = C[i-1] draws token i
    assert out[len(kept) : -1].tolist() == kept[:-1]  # just below C[i] still draws token i
    assert out[-1] == vocab - 1


def test_frequencies_follow_the_probabilities_across_blocks():
    vocab, n = 2 * BLOCK + 300, 40_000
    rng = np.random.default_rng(0)
    tokens = [3, BLOCK - 1, BLOCK, 2 * BLOCK + 299]
    expected = np.array([0.1, 0.2, 0.3, 0.4])
    probs = np.zeros((n, vocab), np.float32)
    probs[:, tokens] = expected * 7.0  # unnormalized: the draw divides by the row's sum
    out = sample_categorical(probs, rng.random(n))
    freq = np.array([(out == t).mean() for t in tokens])
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert freq.sum() == 1.0
    assert np.all(np.abs(freq - expected) <= 5 * sigma), freq


def test_a_block_whose_own_sums_round_low_keeps_the_draw_inside_it():
    # Block 0: 1.0 then 1,023 tokens of 2**-60. numpy's pairwise block sum keeps part of the
    # tiny mass (1 + 3 * 2**-52); the sequential in-block sums lose all of it (1.0), so a target
    # near the total lies past the block's last in-block sum. Block 1 is masked.
    probs = np.zeros((1, 2 * BLOCK), np.float32)
    probs[0, :BLOCK] = 2.0**-60
    probs[0, 0] = 1.0
    out = sample_categorical(probs, np.array([1.0 - 2.0**-53]))
    assert out[0] < BLOCK and probs[0, out[0]] > 0
