"""One categorical draw per row of a probability matrix by inverse transform: one uniform per
row, found in the row's cumulative sums kept in float64.

The exponential race (``argmax(p / q)``, ``q ~ Exp(1)``: vLLM's GPU sampler) needs V random
numbers per row; on a CPU, drawing them dominates a sampled decode step of a large vocabulary
(262,144 exponentials per row with torch's mt19937: about 15 ms a row on 2 cores, against a
model step of 100-300 ms for 16 rows). Inverse transform sampling needs one uniform ``u`` per
row and finds the token ``i`` with ``C[i-1] <= u * C[V-1] < C[i]``, ``C`` the row's cumulative
probability: token ``i`` is drawn with probability ``p_i / sum(p)`` (to float64 rounding).

The cumulative sums are two-level so no [R, V] float64 array is made: the sums of blocks of
``BLOCK`` probabilities (one pass over the row), the block holding ``u * C[V-1]``, then the
cumulative sums inside that block only. A zero probability (a masked token) is never drawn: the
first index whose cumulative sum exceeds the target cannot add nothing to the one before.
"""

from __future__ import annotations

import numpy as np

#: Probabilities per block of the first-level sums.
BLOCK = 1024


def sample_categorical(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """One token per row.

    Args:
        probs: [R, V] float32, non-negative, each row with positive mass (it need not sum to 1).
        uniforms: [R] float64 in [0, 1), row r's draw.

    Returns:
        [R] int64: row r's token ``i`` with ``C[i-1] <= uniforms[r] * C[V-1] < C[i]``, ``C``
        the row's cumulative sums in float64.
    """
    num_rows, vocab_size = probs.shape
    sums = _block_sums(probs)  # sums: [R, ceil(V / BLOCK)] float64
    cum = np.cumsum(sums, axis=1)
    target = np.asarray(uniforms, np.float64) * cum[:, -1]  # target: [R]
    # The first block whose cumulative sum passes the target (u * C[V-1] rounded up to C[V-1]
    # takes the last block with mass).
    block = np.minimum((cum <= target[:, None]).sum(axis=1), _last_positive(sums))
    rows = np.arange(num_rows)
    before = np.where(block > 0, cum[rows, np.maximum(block - 1, 0)], 0.0)

    index = block[:, None] * BLOCK + np.arange(BLOCK)  # index: [R, BLOCK]
    segment = np.take_along_axis(probs, np.minimum(index, vocab_size - 1), axis=1)
    segment = np.where(index < vocab_size, segment.astype(np.float64), 0.0)
    within = np.cumsum(segment, axis=1) + before[:, None]
    # The block's own sums can round below its first-level sum: take its last positive token.
    offset = np.minimum((within <= target[:, None]).sum(axis=1), _last_positive(segment))
    return (block * BLOCK + offset).astype(np.int64)


def _block_sums(probs: np.ndarray) -> np.ndarray:
    """[R, V] float32 -> [R, ceil(V / BLOCK)] float64 sums of consecutive blocks."""
    num_rows, vocab_size = probs.shape
    full = vocab_size // BLOCK
    blocks = probs[:, : full * BLOCK].reshape(num_rows, full, BLOCK)
    parts = [np.add.reduce(blocks, axis=2, dtype=np.float64)]
    if vocab_size % BLOCK:
        parts.append(np.add.reduce(probs[:, full * BLOCK :], axis=1, dtype=np.float64)[:, None])
    return np.concatenate(parts, axis=1)


def _last_positive(x: np.ndarray) -> np.ndarray:
    """[R, N] -> [R] int64: the last column of each row holding a positive value."""
    return x.shape[1] - 1 - np.argmax(x[:, ::-1] > 0, axis=1)
