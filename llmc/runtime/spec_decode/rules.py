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

A request that samples (temperature > 0) speculates too, with rejection sampling (Leviathan et
al., 2023; Chen et al., 2023, "Accelerating Large Language Model Decoding with Speculative
Sampling"), which keeps the target's distribution exactly: both drafting methods propose
deterministically (the n-gram's continuation, the draft model's argmax), so the proposal is a
point mass q = 1 at draft d; draft i is accepted with probability ``min(1, p(d) / q(d)) = p(d)``
under the target's distribution p of row i (temperature, min-p, top-k, top-p applied); at the
first rejection the token is drawn from ``max(p - q, 0)`` normalized: p without d; after k
acceptances the bonus token is drawn from row k.

Speculation is off for a request constrained by a grammar, asking for logprobs, with
penalties, n > 1 or below its ``min_tokens``: those keep one token per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from llmc.runtime.sampling.stop_checker import below_min_tokens
from llmc.runtime.sequence import Sequence

if TYPE_CHECKING:
    import torch


def num_drafts_allowed(seq: Sequence, k: int, max_model_len: int) -> int:
    """How many tokens may be drafted for ``seq`` in the next step: 0 when it may not
    speculate (module docstring) or is not decoding; else at most ``k``, no further than
    ``max_model_len`` and than its ``max_tokens`` leave room for."""
    params = seq.params
    if (
        seq.grammar is not None
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


def verify_sampled(probs: torch.Tensor, drafts: list[int], generator: torch.Generator) -> list[int]:
    """The tokens a step accepts for a sampling request (rejection sampling, module docstring).

    Args:
        probs: [1 + k, V] float32, the target's distribution of each row (`Sampler.probabilities`).
        drafts: the k drafted token ids (a point-mass proposal each).
        generator: the request's generator (its own when seeded).

    Returns:
        1 to k + 1 token ids, distributed as k + 1 draws from the target would be.
    """
    import torch

    accepted = []
    for i, draft in enumerate(drafts):
        if torch.rand((), generator=generator) < probs[i, draft]:
            accepted.append(int(draft))
            continue
        residual = probs[i].clone()
        residual[draft] = 0.0  # p(draft) < 1 here, so some mass is left
        return [*accepted, int(torch.multinomial(residual, 1, generator=generator))]
    return [*accepted, int(torch.multinomial(probs[len(drafts)], 1, generator=generator))]
