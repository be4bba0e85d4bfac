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

Compiled grammars are cached by constraint (`StructuredOutputsParams.key`, least recently used
out); a request gets a copy of the cached matcher in its start state. The tokenizer tables
llguidance needs are built on the first constrained request (seconds, once per engine).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from llmc.runtime.request_check import InvalidRequestError
from llmc.runtime.structured_outputs import FIELD, StructuredOutputsParams

#: Compiled grammars kept per engine (a matcher in its start state each).
CACHE_SIZE = 256


class GrammarError(RuntimeError):
    """A sequence's grammar refused the token appended to it (the mask was not applied)."""


class _Params(Protocol):
    is_greedy: bool


class Constrained(Protocol):
    """What the sampler reads of a sequence: its grammar state, or None, and whether it
    samples greedily."""

    grammar: GrammarState | None
    params: _Params


class GrammarState:
    """One sequence's position in its grammar: a copy of ``start`` (an llguidance ``LLMatcher``
    in its start state, as `GrammarCompiler` caches it) that its tokens advance."""

    def __init__(self, start: Any) -> None:
        self._start = start  # the compiled grammar's start state, shared and never advanced
        self._matcher = start.deep_copy()

    def fill_bitmask(self, row: np.ndarray) -> None:
        """Write the allowed next tokens into ``row``: [ceil(V / 32)] int32, C-contiguous."""
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def allows(self, token_id: int) -> bool:
        """``token_id`` may come next (its bit in the mask would be set), without computing
        the mask."""
        return self._matcher.validate_tokens([int(token_id)]) == 1

    def accept(self, token_id: int) -> None:
        """Advance past ``token_id``.

        Raises:
            GrammarError: the grammar does not allow it here (its mask was not applied).
        """
        if not self._matcher.consume_token(int(token_id)):
            raise GrammarError(f"token {token_id} refused: {self._matcher.get_error()}")

    @property
    def is_stopped(self) -> bool:
        """Nothing but an end-of-sequence token can follow: the output is complete."""
        return self._matcher.is_stopped()

    def fresh(self) -> GrammarState:
        """The same grammar in its start state (a forked completion's)."""
        return GrammarState(self._start)


class GrammarCompiler:
    """Compiles constraints for one engine's tokenizer and vocabulary.

    Args:
        tokenizer: the engine's Hugging Face (fast) tokenizer.
        vocab_size: the model's logits width V (masks cover V tokens).
        eos_token_ids: the model's end-of-sequence ids: allowed once a grammar is complete.
        cache_size: compiled grammars kept.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Iterable[int],
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._lltokenizer = None
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._cache_size = cache_size

    def state(self, params: StructuredOutputsParams) -> GrammarState:
        """A new sequence's grammar state for ``params``.

        ``params`` is checked by ``SamplingParams.validate`` (``LLMEngine.add_request`` runs it
        first).

        Raises:
            InvalidRequestError: (field ``structured_outputs``) none or several constraints
                set, or llguidance cannot compile it (a bad schema, regex or grammar, an
                unsupported schema keyword, or a grammar past llguidance's size limits); the
                message names the reason.
        """
        key = params.key()
        start = self._cache.get(key)
        if start is None:
            start = self._compile(params)
            self._cache[key] = start
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return GrammarState(start)

    def _compile(self, params: StructuredOutputsParams) -> Any:
        import llguidance

        grammar = _grammar_text(params)
        tokenizer = self._llguidance_tokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise InvalidRequestError(f"{FIELD}.{params.kind()} cannot be compiled: {error}", FIELD)
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        if matcher.is_error():
            raise InvalidRequestError(
                f"{FIELD}.{params.kind()} cannot be compiled: {matcher.get_error()}", FIELD
            )
        return matcher

    def _llguidance_tokenizer(self) -> Any:
        if self._lltokenizer is None:
            import llguidance.hf

            self._lltokenizer = llguidance.hf.from_tokenizer(
                self._tokenizer, n_vocab=self.vocab_size, eos_token=self._eos
            )
        return self._lltokenizer


def _grammar_text(params: StructuredOutputsParams) -> str:
    """The llguidance grammar of ``params`` (validated: exactly one constraint set)."""
    import json

    import llguidance

    kind = params.kind()
    try:
        if kind in ("json", "json_object"):
            schema = {"type": "object"} if kind == "json_object" else params.json
            # JSON as json.dumps writes it (", " and ": "), not any run of whitespace: a
            # model may otherwise spend its tokens on blanks inside a valid value
            return llguidance.LLMatcher.grammar_from_json_schema(
                schema, defaults={"whitespace_flexible": False}
            )
        if kind == "choice":
            return llguidance.grammar_from("choice", json.dumps(list(params.choice)))
        if kind == "regex":
            return llguidance.grammar_from("regex", params.regex)
        return llguidance.grammar_from("grammar", params.grammar)
    except (ValueError, RuntimeError) as exc:
        raise InvalidRequestError(f"{FIELD}.{kind} cannot be compiled: {exc}", FIELD) from exc


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
        grammar.fill_bitmask(words)
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
