"""Speculative decoding's rules: which sequences may speculate, how far, and the greedy check of
their drafts (Leviathan et al., 2023, "Fast Inference from Transformers via Speculative
Decoding", with the target's argmax as its distribution).

A sequence in decode gets up to k drafted tokens; one target step computes its last token and
the drafts and returns 1 + k logits rows: row i predicts the token after draft i (row 0 the one
after the last token). The drafts agree with the target while ``draft[i] == argmax(row i)``;
the agreeing drafts are accepted, then the target's own token at the first disagreement (or
after the last draft), so a step yields 1 to k + 1 tokens and the output is exactly the one
greedy decoding without speculation would give. Rejected drafts leave their KV in slots the
next step overwrites (the sequence's ``num_computed_tokens`` stops before them).

Speculation is off for a request that samples (temperature > 0), is constrained by a grammar,
asks for logprobs, has penalties, n > 1 or is below its ``min_tokens``: those keep one token
per step.
"""

from __future__ import annotations

import numpy as np

from llmc.runtime.sequence import Sequence
from llmc.runtime.stop_checker import below_min_tokens


def num_drafts_allowed(seq: Sequence, k: int, max_model_len: int) -> int:
    """How many tokens may be drafted for ``seq`` in the next step: 0 when it may not
    speculate (module docstring) or is not decoding; else at most ``k``, no further than
    ``max_model_len`` and than its ``max_tokens`` leave room for."""
    params = seq.params
    if (
        not params.is_greedy
        or seq.grammar is not None
        or params.logprobs is not None
        or params.has_penalties
        or params.n > 1
        or below_min_tokens(seq)
        or seq.num_tokens - seq.num_computed_tokens != 1
    ):
        return 0
    room = min(max_model_len - seq.num_tokens, params.max_tokens - seq.num_output_tokens - 1)
    return max(0, min(k, room))


def verify_greedy(rows: np.ndarray, drafts: list[int]) -> list[int]:
    """The tokens a step accepts: the drafts that equal the target's argmax, then the target's
    token after them.

    Args:
        rows: [1 + k, V] float32 logits of the last token's position and of each draft's.
        drafts: the k drafted token ids.

    Returns:
        1 to k + 1 token ids.
    """
    targets = rows.argmax(axis=1)
    num_accepted = 0
    while num_accepted < len(drafts) and drafts[num_accepted] == targets[num_accepted]:
        num_accepted += 1
    return [int(t) for t in targets[: num_accepted + 1]]
