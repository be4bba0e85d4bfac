"""n-gram drafting (prompt lookup decoding, Saxena 2023; vLLM's ``"ngram"`` method): the tokens
that followed the most recent earlier occurrence of the sequence's last n tokens.

Free to run (no model): it pays off where the output repeats its context (code edits,
extraction, quoting a document in RAG), and drafts nothing elsewhere.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """Drafts from a sequence's own tokens.

    Args:
        prompt_lookup_min: the shortest suffix matched (tokens, >= 1).
        prompt_lookup_max: the longest suffix matched; longer suffixes are tried first.
    """

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens to follow ``token_ids`` (prompt and output so far): for n from
        ``prompt_lookup_max`` down to ``prompt_lookup_min``, the tokens after the latest
        earlier occurrence of the last n tokens; [] when no suffix recurs.

        Cost: O(len(token_ids) * n) per n tried (numpy comparisons), once per step."""
        if k < 1:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        length = len(tokens)
        for n in range(min(self.prompt_lookup_max, length - 1), self.prompt_lookup_min - 1, -1):
            # windows starting at 0 .. length - n - 1: every occurrence but the suffix itself
            windows = sliding_window_view(tokens[:-1], n)
            starts = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if len(starts):
                follow = int(starts[-1]) + n
                return [int(t) for t in tokens[follow : follow + k]]
        return []
