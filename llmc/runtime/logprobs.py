"""Log probabilities of chosen tokens and the top alternatives, from raw logits rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenLogprobs:
    """Logprobs of R positions.

    Attributes:
        token_logprobs: [R] float32, the chosen token's ``log_softmax``.
        token_ranks: [R] int64, 1 + the number of tokens with a strictly larger logit.
        top_ids: [R, K] int64, the K most likely tokens, most likely first.
        top_logprobs: [R, K] float32, their logprobs.
    """

    token_logprobs: np.ndarray
    token_ranks: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray


def compute_logprobs(logits: np.ndarray, token_ids: np.ndarray, num_top: int) -> TokenLogprobs:
    """Logprobs of ``token_ids`` under ``logits`` and the ``num_top`` most likely tokens.

    Computed in float64 then stored as float32: ``log_softmax(x) = x - max - log(sum(exp(x -
    max)))``. The rank counts strictly larger logits (vLLM's ``batched_count_greater_than``),
    so tied tokens share a rank. Ties among the top tokens are ordered by token id.

    Args:
        logits: [R, V] float32 raw model output (before penalties or temperature).
        token_ids: [R] integer, the chosen token of each row.
        num_top: K >= 0.

    Returns:
        `TokenLogprobs` of the R rows.
    """
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))  # x: [R, V] logprobs
    rows = np.arange(x.shape[0])
    token_ids = np.asarray(token_ids, np.int64)
    chosen = logits[rows, token_ids]
    ranks = (logits > chosen[:, None]).sum(axis=1) + 1
    k = min(num_top, x.shape[1])
    if k:
        top = np.argpartition(-x, k - 1, axis=1)[:, :k]  # unordered top k
        order = np.lexsort((top, -np.take_along_axis(x, top, 1)), axis=1)
        top_ids = np.take_along_axis(top, order, 1)
    else:
        top_ids = np.empty((x.shape[0], 0), np.int64)
    return TokenLogprobs(
        token_logprobs=x[rows, token_ids].astype(np.float32),
        token_ranks=ranks.astype(np.int64),
        top_ids=top_ids.astype(np.int64),
        top_logprobs=np.take_along_axis(x, top_ids, 1).astype(np.float32),
    )
