"""min_tokens, penalties, min_p and logprobs against independent numpy computations."""

import numpy as np
import pytest

from llmc.runtime.logprobs import compute_logprobs
from llmc.runtime.sampling.penalties import apply_min_tokens, apply_penalties
from llmc.runtime.sampling.sampler import Sampler
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.sequence import Sequence
from tests.runtime.test_sampler import PROBS, assert_frequencies

EOS = 1


def seq_with(prompt, output, **params) -> Sequence:
    seq = Sequence("r", list(prompt), SamplingParams(**params))
    seq.output_token_ids = list(output)
    return seq


def reference_penalties(row, prompt, output, rep, freq, pres) -> np.ndarray:
    """The penalties written out token by token, in float64."""
    x = row.astype(np.float64)
    for t in set(prompt) | set(output):
        x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
    for t in set(output):
        x[t] -= freq * output.count(t) + pres
    return x


@pytest.mark.parametrize(
    ("rep", "freq", "pres"), [(1.3, 0.0, 0.0), (1.0, 0.7, 0.0), (1.0, 0.0, -1.5), (0.8, 1.2, 0.4)]
)
def test_penalties_match_the_token_by_token_reference(rep, freq, pres):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 40)).astype(np.float32)
    seqs = [
        seq_with(
            [3, 4, 4, 9],
            [9, 9, 12, 30, 12, 9],
            repetition_penalty=rep,
            frequency_penalty=freq,
            presence_penalty=pres,
        ),
        seq_with([5], [], repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres),
        seq_with([3, 4], [9, 9]),  # no penalties: untouched
    ]
    out = logits.copy()
    apply_penalties(out, seqs)
    for i, seq in enumerate(seqs):
        p = seq.params
        expected = reference_penalties(
            logits[i],
            seq.prompt_token_ids,
            seq.output_token_ids,
            p.repetition_penalty,
            p.frequency_penalty,
            p.presence_penalty,
        )
        np.testing.assert_allclose(out[i], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out[2], logits[2])


def test_greedy_row_takes_the_argmax_after_penalties():
    logits = np.zeros((1, 10), np.float32)
    logits[0, [4, 6]] = [2.0, 1.5]  # 4 wins unless penalized
    seq = seq_with([0], [4, 4], temperature=0.0, frequency_penalty=0.3)  # 2.0 - 0.6 < 1.5
    assert Sampler(seed=0)(logits, [seq]).tolist() == [6]
    seq = seq_with([0], [4, 4], temperature=0.0, frequency_penalty=0.2)  # 2.0 - 0.4 > 1.5
    assert Sampler(seed=0)(logits, [seq]).tolist() == [4]
    seq = seq_with([4], [], temperature=0.0, repetition_penalty=1.5)  # prompt token: 2.0/1.5
    assert Sampler(seed=0)(logits, [seq]).tolist() == [6]


def test_min_tokens_masks_eos_and_stop_token_ids_until_reached():
    logits = np.zeros((4, 8), np.float32)
    logits[:, EOS] = 3.0
    logits[:, 5] = 2.0
    logits[:, 7] = 1.0
    seqs = [
        seq_with([2], [6], temperature=0.0, min_tokens=2),  # 1 < 2: EOS masked
        seq_with([2], [6], temperature=0.0, min_tokens=2, stop_token_ids=[5]),  # both masked
        seq_with([2], [6, 6], temperature=0.0, min_tokens=2),  # reached: EOS allowed
        seq_with([2], [6], temperature=0.0, min_tokens=2, ignore_eos=True),  # EOS not a stop
    ]
    assert Sampler(seed=0, eos_token_ids={EOS})(logits, seqs).tolist() == [5, 7, EOS, EOS]
    masked = logits.copy()
    apply_min_tokens(masked, seqs, {EOS})
    assert np.isneginf(masked[1, [EOS, 5]]).all() and not np.isinf(masked[2]).any()


@pytest.mark.parametrize(("min_p", "kept"), [(0.3, 3), (0.5, 2), (1.0, 1), (0.12, 5)])
def test_min_p_keeps_tokens_at_least_min_p_times_the_most_likely(min_p, kept):
    # PROBS = 0.4, 0.25, 0.15, 0.1, 0.06, 0.04: the threshold is 0.4 * min_p.
    expected = np.where(PROBS >= 0.4 * min_p, PROBS, 0.0)
    assert np.count_nonzero(expected) == kept
    expected /= expected.sum()
    n = 20_000
    rows = np.tile(np.log(PROBS).astype(np.float32), (n, 1))
    seqs = [Sequence(str(i), [0], SamplingParams(min_p=min_p)) for i in range(n)]
    tokens = Sampler(seed=0)(rows, seqs)
    assert tokens.max() < kept
    assert_frequencies(tokens, expected)


def test_min_p_applies_after_temperature():
    # T = 2 flattens PROBS to sqrt(p)/sum: 0.632, 0.5, 0.387, 0.316, 0.245, 0.2 (x 1/2.33);
    # min_p 0.6 keeps those >= 0.6 * 0.632 = 0.379: tokens 0, 1, 2 (token 2 would be cut at T=1).
    tempered = PROBS**0.5
    expected = np.where(tempered >= 0.6 * tempered.max(), tempered, 0.0)
    expected /= expected.sum()
    n = 20_000
    rows = np.tile(np.log(PROBS).astype(np.float32), (n, 1))
    seqs = [Sequence(str(i), [0], SamplingParams(min_p=0.6, temperature=2.0)) for i in range(n)]
    assert_frequencies(Sampler(seed=0)(rows, seqs), expected)


def test_logprobs_ranks_and_top_tokens_match_numpy():
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(5, 64)) * 3).astype(np.float32)
    chosen = np.array([0, 17, 63, int(np.argmax(logits[3])), 5])
    lp = compute_logprobs(logits, chosen, num_top=4)
    x = logits.astype(np.float64)
    reference = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    for r in range(5):
        order = sorted(range(64), key=lambda t: -reference[r, t])  # most likely first
        assert lp.token_logprobs[r] == pytest.approx(reference[r, chosen[r]], abs=1e-5)
        assert lp.token_ranks[r] == order.index(chosen[r]) + 1
        assert lp.top_ids[r].tolist() == order[:4]
        np.testing.assert_allclose(lp.top_logprobs[r], reference[r, order[:4]], atol=1e-5)
    assert lp.token_ranks[3] == 1
    assert compute_logprobs(logits, chosen, 0).top_ids.shape == (5, 0)
