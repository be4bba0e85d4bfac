"""Constrained decoding: structured-output constraints compiled to token masks (llguidance).

Method (as vLLM's and llama.cpp's guidance backends, Microsoft's llguidance library): the
constraint (`StructuredOutputsParams`) becomes an llguidance grammar (JSON schemas, regexes and
choices through llguidance's own translators; Lark, or GBNF converted to Lark). A matcher per
sequence follows the tokens it has generated; before each sampling step it computes a bitmask
over the vocabulary (bit ``t % 32`` of int32 word ``t // 32`` set: token ``t`` may come next),
and the sampler sets the logits of the other tokens to -inf (`apply_token_masks`), so the
argmax or the draw can only pick a token that keeps the text inside the language. Once the
grammar is complete only the end-of-sequence tokens stay allowed; once nothing more can
follow, the matcher is stopped and the sequence ends (``StopChecker``).

llguidance was chosen over xgrammar by measurement (``benchmarks/bench_grammar.py``, Gemma 3's
262,144-token vocabulary): both compute a mask in microseconds against a decode step's
milliseconds, but xgrammar took 1.0 s (1.9 s on a busy host) to compile a nested schema with a
bounded string where llguidance took 8 ms, and a request waits for its compile.

Compiling, checking and caching constraints is ``grammar_compiler.py``'s; a request gets a copy
of the cached matcher in its start state (`GrammarState`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from llmc.runtime.structured.structured_outputs import FIELD


class GrammarError(RuntimeError):
    """A sequence's constraint failed while it generated (llguidance hit a limit on a path its
    compile-time probe did not take): the request ends with it, the engine goes on.

    Attributes:
        field: the `SamplingParams` field whose constraint failed (``structured_outputs``).
    """

    def __init__(self, message: str, field: str = FIELD) -> None:
        super().__init__(message)
        self.field = field


class _Params(Protocol):
    is_greedy: bool


class Constrained(Protocol):
    """What the sampler reads of a sequence: its grammar state, or None, and whether it
    samples greedily."""

    grammar: GrammarState | None
    params: _Params


class GrammarState:
    """One sequence's position in its grammar: a copy of ``start`` (an llguidance ``LLMatcher``
    in its start state, as ``GrammarCompiler`` caches it) that its tokens advance.

    llguidance never raises for a grammar's own failure (a resource limit, a refused token):
    the matcher enters an error state and stays there. A state in error masks nothing and
    accepts nothing; `error` says why, and the stop checker ends the sequence with it, alone.
    """

    def __init__(self, start: Any) -> None:
        self._start = start  # the compiled grammar's start state, shared and never advanced
        self._matcher = start.deep_copy()
        self._error: str | None = None

    def fill_bitmask(self, row: np.ndarray) -> bool:
        """Write the allowed next tokens into ``row``: [ceil(V / 32)] int32, C-contiguous.
        False (``row`` is not a mask) once the grammar is in error."""
        if self.error is None:
            self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        return self.error is None

    def allows(self, token_id: int) -> bool:
        """``token_id`` may come next (its bit in the mask would be set), without computing
        the mask."""
        return self.error is None and self._matcher.validate_tokens([int(token_id)]) == 1

    def accept(self, token_id: int) -> None:
        """Advance past ``token_id``; when the grammar refuses it (or was in error), `error`
        says why and the state advances no more."""
        if self.error is None and not self._matcher.consume_token(int(token_id)):
            self._error = f"token {token_id} refused: {library_message(self._matcher.get_error())}"

    @property
    def error(self) -> str | None:
        """Why this sequence's grammar failed (llguidance's reason, without its state dump),
        or None."""
        if self._error is None and self._matcher.is_error():
            self._error = library_message(self._matcher.get_error())
        return self._error

    @property
    def is_stopped(self) -> bool:
        """Nothing but an end-of-sequence token can follow: the output is complete."""
        return self.error is None and self._matcher.is_stopped()

    def fresh(self) -> GrammarState:
        """The same grammar in its start state (a forked completion's)."""
        return GrammarState(self._start)


def library_message(text: str, limit: int = 300) -> str:
    """llguidance's error text as a client may read it: its first line (the rest is the
    parser's state), at most ``limit`` characters; a Rust panic is named, not quoted."""
    if "panicked" in text:
        return "the grammar library failed on this constraint (an internal error)"
    line = next((part.strip() for part in text.splitlines() if part.strip()), "unknown error")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def apply_token_masks(logits: np.ndarray, seqs: Sequence[Constrained]) -> None:
    """Set to -inf, in place, the logits of the tokens each constrained row's grammar forbids.

    Args:
        logits: [S, V] float32, one row per sequence of ``seqs``; modified.
        seqs: the rows' sequences; rows whose ``grammar`` is None are left as they are.

    A greedy row whose argmax the grammar allows is left as it is (llama.cpp's order: check the
    choice first, mask only when it is refused): masking lowers only other logits, so the
    argmax, and the sampler's greedy choice, would be the same token; a row's log-probs are
    of the raw logits either way. Inside a string nearly every step takes this path.

    Measured on 2 cores (Gemma 3 270M int4, 16 constrained requests), and not done: computing
    the masks while the model runs (a worker thread slowed the model run by as much as it hid),
    and llguidance's parallel executor (slower than one row after another).
    """
    words = None
    for i, seq in enumerate(seqs):
        grammar = seq.grammar
        if grammar is None:
            continue
        if seq.params.is_greedy and grammar.allows(int(logits[i].argmax())):
            continue
        if words is None:
            words = np.empty((logits.shape[1] + 31) // 32, np.int32)
        if grammar.fill_bitmask(words):  # else the grammar failed: the row's request ends
            apply_bitmask(logits[i], words)


def apply_bitmask(row: np.ndarray, words: np.ndarray) -> None:
    """Set to -inf, in place, the entries of ``row`` ([V] float32) whose bit in ``words``
    ([ceil(V / 32)] int32) is clear: bit ``t % 32`` of word ``t // 32`` is token ``t``.

    A grammar allows either few tokens (structure: a quote, a comma, an enum's next letters) or
    nearly all (inside a string), so only the minority is expanded, from the words that hold
    it: the allowed logits are saved, the row filled with -inf and they are put back; or the
    few forbidden ones are set. Expanding every bit and writing through a boolean mask costs
    several times more at V = 262,144 (measured on 16 rows: ~6 ms against ~1 ms)."""
    vocab_size = row.shape[0]
    if 2 * np.count_nonzero(words) < words.shape[0]:  # few words hold an allowed token
        at = np.flatnonzero(words)
        keep = _bit_positions(words[at], at, vocab_size)
        values = row[keep]
        row.fill(-np.inf)
        row[keep] = values
    else:
        at = np.flatnonzero(words != -1)  # words with a forbidden token
        row[_bit_positions(~words[at], at, vocab_size)] = -np.inf


def _bit_positions(selected: np.ndarray, at: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids of the set bits of ``selected`` (int32 words found at word indices ``at``),
    below ``vocab_size`` (the last word's padding bits are not tokens)."""
    # little-endian words, little bit order per byte: bits in token order
    bits = np.unpackbits(selected.view(np.uint8), bitorder="little").reshape(-1, 32)
    tokens = (at[:, None] * 32 + np.arange(32))[bits.view(np.bool_)]
    return tokens[tokens < vocab_size]
