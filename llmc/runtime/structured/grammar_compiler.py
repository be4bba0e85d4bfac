"""Structured-output constraints compiled to llguidance matchers, each checked the way it will
be used before a request carrying it is queued.

llguidance accepts some grammars at compile time that then fail at the first token: a regex
``a{1000000}`` (its lexer runs out of states), a JSON schema whose required property refers back
to itself, a grammar with no base case (``root ::= "a" root``: no finite output satisfies it, and
llguidance's forced-token search never ends); a ``$ref`` cycle with nothing at the bottom
compiles to an empty language. So a compiled constraint is probed on a copy of its matcher: the
first mask is computed (it must allow a token) and a few tokens are consumed along the lowest
allowed token; any error there is the request's 400, naming the limit it hit. The probe costs a
few mask computations, microseconds each; a constraint that passes it may still fail later on a
path the probe did not take, which ends only that request (``GrammarState.error``).

A ``choice`` is compiled as one regex alternation of its escaped strings, not as llguidance's
``choice`` grammar (one grammar row of N alternatives): the row form refuses more than 2,000
strings at the first token and, with its limit raised, took 3.6 s to compile 40,000 strings and
42 ms per mask; the regex form took 0.21 s and 0.06 ms (tiny tokenizer, 2 cores).

Thread-safe: compiling may run on any thread (the server compiles on a worker pool, off the
engine thread); llguidance drops the GIL while it builds a matcher.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from llmc.runtime.errors import InvalidRequestError
from llmc.runtime.structured.grammar import GrammarState, library_message
from llmc.runtime.structured.structured_outputs import FIELD, StructuredOutputsParams

#: Compiled grammars kept per engine (a matcher in its start state each).
CACHE_SIZE = 256
#: Tokens a new constraint's probe consumes (along the lowest allowed token).
PROBE_TOKENS = 4
_UNSATISFIABLE = "no output satisfies it (the grammar allows no next token)"
# The characters Rust's ``regex::escape`` escapes (llguidance's regexes are Rust's syntax).
_REGEX_ESCAPES = str.maketrans({c: "\\" + c for c in "\\.+*?()|[]{}^$#&-~"})
_BAR_KEPT = str.maketrans({c: "\\" + c for c in "\\.+*?()[]{}^$#&-~"})  # joined: | separates


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
        self._lock = threading.Lock()  # the cache and the tokenizer tables

    def state(self, params: StructuredOutputsParams) -> GrammarState:
        """A new sequence's grammar state for ``params`` (compiled, or from the cache).

        Raises:
            InvalidRequestError: as `compile`.
        """
        return GrammarState(self.compile(params))

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The start state of ``params``' grammar (an llguidance ``LLMatcher``, never advanced:
        `GrammarState` copies it), compiled and probed, or from the cache.

        Raises:
            InvalidRequestError: (field ``structured_outputs``) none or several constraints
                set, llguidance cannot compile it (a bad schema, regex or grammar, an
                unsupported keyword), no output satisfies it, or its probe hit one of
                llguidance's limits; the message names the reason and the limit.
        """
        key = params.key()
        with self._lock:
            start = self._cache.get(key)
            if start is not None:
                self._cache.move_to_end(key)
                return start
        start = self._compile(params)
        with self._lock:
            self._cache[key] = start
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return start

    def _compile(self, params: StructuredOutputsParams) -> Any:
        import llguidance

        kind = params.kind()
        grammar = grammar_text(params)
        tokenizer = self._llguidance_tokenizer()
        # never raises for the grammar's faults; it releases the GIL while it builds
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            message = library_message(matcher.get_error())
            raise InvalidRequestError(f"{FIELD}.{kind} cannot be compiled: {message}", FIELD)
        error = _probe(matcher, self.vocab_size, self._eos)
        if error:
            message = library_message(error)
            raise InvalidRequestError(f"{FIELD}.{kind} cannot be used: {message}", FIELD)
        return matcher

    def warm_up(self) -> None:
        """Build llguidance's tables of the tokenizer now, not at the first constraint: for a
        262,144-token vocabulary about 9 s, most of it holding the GIL (measured on Gemma 3
        270M, 2 cores), which would stall the engine thread behind the first constrained
        request. A server calls it before it takes requests."""
        self._llguidance_tokenizer()

    def _llguidance_tokenizer(self) -> Any:
        with self._lock:
            if self._lltokenizer is None:
                import llguidance.hf

                self._lltokenizer = llguidance.hf.from_tokenizer(
                    self._tokenizer, n_vocab=self.vocab_size, eos_token=self._eos
                )
            return self._lltokenizer


def _probe(start: Any, vocab_size: int, eos_token_ids: list[int]) -> str:
    """Use a copy of ``start`` as generation would: the first mask, then up to `PROBE_TOKENS`
    tokens along the lowest allowed non-EOS token. The error met, or "" (none)."""
    matcher = start.deep_copy()
    words = np.zeros((vocab_size + 31) // 32, np.int32)
    for step in range(PROBE_TOKENS + 1):
        if matcher.is_stopped():
            break
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if matcher.is_error():
            error = matcher.get_error()
            return _UNSATISFIABLE if step == 0 and "NoExtensionBias" in error else error
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size]
        allowed = np.flatnonzero(bits)  # numpy throughout: a loose grammar allows ~V tokens
        tokens = allowed[~np.isin(allowed, eos_token_ids)]
        if not tokens.size:
            if not allowed.size or not matcher.is_accepting():
                return _UNSATISFIABLE
            break
        token = int(tokens[0])
        if not matcher.consume_token(token) or matcher.is_error():
            return matcher.get_error() or f"token {token} refused"
    return ""


def grammar_text(params: StructuredOutputsParams) -> str:
    """The llguidance grammar of ``params`` (one constraint set, else InvalidRequestError)."""
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
            return llguidance.grammar_from("regex", choice_regex(params.choice))
        if kind == "regex":
            return llguidance.grammar_from("regex", params.regex)
        return llguidance.grammar_from("grammar", params.grammar)
    except (ValueError, RuntimeError) as exc:
        message = library_message(str(exc))
        raise InvalidRequestError(f"{FIELD}.{kind} cannot be compiled: {message}", FIELD) from exc


def choice_regex(choices: Iterable[str]) -> str:
    """A regex (Rust syntax) matching exactly one of ``choices``: their escaped alternation.
    Escaped in one ``str.translate`` over the joined text unless a choice holds the separator
    ``|``: 6 ms for 40,000 strings against 48 ms string by string, time in which the GIL is
    held and the engine thread waits."""
    choices = list(choices)
    if any("|" in c for c in choices):
        return "(" + "|".join(c.translate(_REGEX_ESCAPES) for c in choices) + ")"
    return "(" + "|".join(choices).translate(_BAR_KEPT) + ")"
