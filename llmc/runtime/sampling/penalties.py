"""Logits processors that depend on a sequence's tokens: min_tokens and the three penalties."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from llmc.runtime.sampling.stop_checker import below_min_tokens, stop_token_ids
from llmc.runtime.sequence import Sequence

# Penalized logits stay within +-1e30: divided by the smallest sampled temperature (1e-5) they
# are still finite in float32 (max 3.4e38), so no row's softmax turns NaN.
_FINITE = np.float32(1e30)


def apply_min_tokens(
    logits: np.ndarray, seqs: list[Sequence], eos_token_ids: Iterable[int]
) -> None:
    """Forbid the stop tokens of rows that have not reached ``min_tokens`` (in place).

    Args:
        logits: [S, V] float32, one row per sequence of ``seqs``; modified in place.
        seqs: the rows' sequences.
        eos_token_ids: the model's EOS ids, forbidden unless the row sets ``ignore_eos``.

    Source: vLLM's ``MinTokensLogitsProcessor`` (stop token ids plus EOS set to -inf).
    """
    vocab_size = logits.shape[1]
    for i, seq in enumerate(seqs):
        if below_min_tokens(seq):
            stop_ids = [t for t in stop_token_ids(seq.params, eos_token_ids) if t < vocab_size]
            logits[i, stop_ids] = -np.inf


def apply_penalties(logits: np.ndarray, seqs: list[Sequence]) -> None:
    """Apply each row's repetition, frequency and presence penalties (in place).

    For row i with output token counts ``c`` [V]:

    - repetition (Keskar et al. 2019, CTRL; vLLM's semantics): for every token of the prompt or
      the output, ``x = x / r`` if ``x > 0`` else ``x * r``;
    - frequency and presence (OpenAI's definition, over output tokens only):
      ``x -= frequency_penalty * c + presence_penalty * (c > 0)``.

    Args:
        logits: [S, V] float32, one row per sequence of ``seqs``; modified in place.
        seqs: the rows' sequences.
    """
    vocab_size = logits.shape[1]
    for i, seq in enumerate(seqs):
        params = seq.params
        if not params.has_penalties:
            continue
        row = logits[i]  # a view: [V]
        output = np.asarray(seq.output_token_ids, np.int64)
        if params.repetition_penalty != 1.0:
            seen = np.zeros(vocab_size, np.bool_)
            seen[np.asarray(seq.prompt_token_ids, np.int64)] = True
            seen[output] = True
            x = row[seen]
            penalty = np.float32(params.repetition_penalty)
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                x = np.where(x > 0, x / penalty, x * penalty)
            # A penalty near 0 (or past float32's range) would make a logit +-inf and the row's
            # softmax NaN: clip to the finite range, which keeps the penalty's order.
            row[seen] = np.clip(np.nan_to_num(x), -_FINITE, _FINITE)
        if output.size and (params.frequency_penalty or params.presence_penalty):
            counts = np.bincount(output, minlength=vocab_size).astype(np.float32)
            row -= np.float32(params.frequency_penalty) * counts
            row -= np.float32(params.presence_penalty) * (counts > 0)
