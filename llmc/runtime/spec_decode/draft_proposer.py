"""Drafting with a draft model: a smaller or quantized engine of the same model (an int4 engine
of the float32 target, say), run greedily k steps ahead of each speculating sequence.

The draft keeps its own paged KV cache over the *target's* block tables: token p of a sequence
lives in the same block and slot in both caches, so the draft needs no block manager of its
own (its runner is made with the target's ``num_blocks`` and ``block_size``). A sequence's
``num_draft_computed`` says how many of its leading tokens the draft cache holds; the first
draft step of a step catches up from there to the sequence's last token (the whole prompt the
first time, chunked to ``max_step_tokens``), then each further draft step feeds one drafted
token. Drafts rejected by the target leave their KV in slots that are overwritten later
(``Scheduler.update_from_output`` cuts ``num_draft_computed`` back to the verified tokens).
Blocks shared by prefix caching hold the same tokens at the same positions in every sequence
that shares them, so whichever sequence writes them writes the same draft KV.
"""

from __future__ import annotations

import numpy as np

from llmc.runtime.runners.runner import Runner
from llmc.runtime.scheduling.step_builder import pack_step
from llmc.runtime.sequence import Sequence


class DraftProposer:
    """Fills the ``draft_token_ids`` of scheduled sequences with a draft model's greedy tokens.

    Args:
        runner: the draft engine's runner; its ``block_size`` must equal the target's and its
            cache must hold every block id the target uses.
        max_step_tokens: most tokens in one draft runner call (catch-up is chunked to it).

    Raises:
        ValueError: ``max_step_tokens`` below 1.
    """

    def __init__(self, runner: Runner, max_step_tokens: int) -> None:
        if max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be at least 1, got {max_step_tokens}")
        self.runner = runner
        self.max_step_tokens = max_step_tokens

    def propose(self, seqs: list[Sequence], num_drafts: list[int]) -> None:
        """Set ``seqs[i].draft_token_ids`` to ``num_drafts[i]`` greedy draft tokens (each >= 1);
        the sequences' blocks must cover positions up to ``num_tokens + num_drafts - 2`` (the
        scheduler allocated them for the target's verification step).

        Raises:
            What the draft runner raises.
        """
        drafts: list[list[int]] = [[] for _ in seqs]
        last = self._catch_up(seqs)  # the draft's token after each sequence's last token
        for i, token in enumerate(last):
            drafts[i].append(token)
        for j in range(1, max(num_drafts, default=0)):
            active = [i for i, n in enumerate(num_drafts) if n > j]
            step = pack_step(
                [[drafts[i][-1]] for i in active],
                [seqs[i].num_tokens - 1 + j for i in active],
                [seqs[i].block_ids for i in active],
                self.runner.block_size,
            )
            tokens = self.runner.execute(step).argmax(axis=1)
            for i, token in zip(active, tokens, strict=True):
                drafts[i].append(int(token))
        for seq, draft, n in zip(seqs, drafts, num_drafts, strict=True):
            seq.draft_token_ids = draft[:n]
            seq.num_draft_computed = seq.num_tokens + n - 1

    def _catch_up(self, seqs: list[Sequence]) -> list[int]:
        """Compute each sequence's tokens from ``num_draft_computed`` to its last one in the
        draft cache, in calls of at most ``max_step_tokens`` tokens; the draft's greedy token
        after each sequence's last token."""
        pieces = []  # (sequence index, start position, tokens, ends the sequence)
        for i, seq in enumerate(seqs):
            start = min(seq.num_draft_computed, seq.num_tokens - 1)
            for lo in range(start, seq.num_tokens, self.max_step_tokens):
                hi = min(lo + self.max_step_tokens, seq.num_tokens)
                pieces.append((i, lo, seq.token_ids(lo, hi), hi == seq.num_tokens))
        last = [0] * len(seqs)
        batch: list[tuple[int, int, list[int], bool]] = []
        num_batched = 0  # tokens in `batch`
        for piece in [*pieces, None]:
            full = piece is None or num_batched + len(piece[2]) > self.max_step_tokens
            if batch and full:
                step = pack_step(
                    [p[2] for p in batch],
                    [p[1] for p in batch],
                    [seqs[p[0]].block_ids for p in batch],
                    self.runner.block_size,
                )
                logits = self.runner.execute(step)  # one row per piece: its last token
                for (i, _, _, ends), row in zip(batch, logits, strict=True):
                    if ends:
                        last[i] = int(np.argmax(row))
                batch, num_batched = [], 0
            if piece is not None:
                batch.append(piece)
                num_batched += len(piece[2])
        return last
