"""The packed inputs of one model step: the contract between the engine loop and every runner."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepInputs:
    """One step of T packed tokens from B sequences (no padding), DESIGN §3.

    Every array is a contiguous numpy array on the host.

    Attributes:
        input_ids: [T] int64, the new tokens of every scheduled sequence, sequence after sequence.
        positions: [T] int64, each token's position in its sequence (0-based).
        seq_lens: [B] int32, each sequence's context length *after* this step (cached + new).
        query_start_loc: [B+1] int32, prefix sums of the new-token counts; sequence b owns tokens
            ``query_start_loc[b]:query_start_loc[b+1]``.
        block_tables: [B, max_blocks_per_seq] int32, the KV block ids of each sequence in order;
            entries past a sequence's last block are 0 and never read.
        slot_mapping: [T] int64, the cache slot (``block_id * block_size + offset``) each new
            token's key and value are written to.
        logits_indices: [R] int64, rows of T whose logits are wanted: per sequence in step
            order, the positions whose logits give prompt logprobs, then its last token if it
            samples this step.
        lora_slot_ids: [T] int64, the adapter slot of each token (``llmc.engine.lora``; -1:
            the base model); None: every token on the base model.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    logits_indices: np.ndarray
    lora_slot_ids: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        """T, the number of packed tokens."""
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        """B, the number of sequences in the step."""
        return int(self.seq_lens.shape[0])


def single_prefill(token_ids: np.ndarray, block_size: int, all_logits: bool = True) -> StepInputs:
    """A step that prefills one sequence from position 0 in blocks ``0..ceil(T/block_size)-1``.

    ``token_ids``: [T] integer array. With ``all_logits`` every position's logits are asked for
    (perplexity, KL, calibration), else only the last one's. The runner needs at least
    ``ceil(T / block_size)`` KV blocks. Raises ValueError for an empty sequence.
    """
    ids = np.ascontiguousarray(token_ids, dtype=np.int64).reshape(-1)
    t = int(ids.shape[0])
    if t == 0:
        raise ValueError("a prefill step needs at least one token")
    num_blocks = -(-t // block_size)
    return StepInputs(
        input_ids=ids,
        positions=np.arange(t, dtype=np.int64),
        seq_lens=np.array([t], np.int32),
        query_start_loc=np.array([0, t], np.int32),
        block_tables=np.arange(num_blocks, dtype=np.int32)[None, :],
        slot_mapping=np.arange(t, dtype=np.int64),
        logits_indices=np.arange(t, dtype=np.int64) if all_logits else np.array([t - 1]),
    )


def prefill_chunks(token_ids: np.ndarray, block_size: int, chunk: int) -> Iterator[StepInputs]:
    """``single_prefill``'s sequence as consecutive chunked-prefill steps of at most ``chunk``
    tokens, each asking for all its positions' logits: the logits of every position, at most
    [chunk, V] per step instead of [T, V] at once. Each step reads the earlier chunks' keys
    and values from the same blocks ``0..ceil(T/block_size)-1`` (the runner keeps them between
    steps, as an engine step does), so the runner needs as many KV blocks as
    ``single_prefill``'s. Raises ValueError for an empty sequence or ``chunk`` below 1."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    whole = single_prefill(token_ids, block_size, all_logits=True)
    t = whole.num_tokens
    for start in range(0, t, chunk):
        stop = min(t, start + chunk)
        yield StepInputs(
            input_ids=whole.input_ids[start:stop],
            positions=whole.positions[start:stop],
            seq_lens=np.array([stop], np.int32),
            query_start_loc=np.array([0, stop - start], np.int32),
            block_tables=whole.block_tables,
            slot_mapping=whole.slot_mapping[start:stop],
            logits_indices=np.arange(stop - start, dtype=np.int64),
        )
