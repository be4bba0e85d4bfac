"""Incremental detokenization of one request's output, with stop-string detection."""

from __future__ import annotations

from typing import Any

from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.stop_matcher import StopMatcher

# Prompt tokens decoded as left context of the first output token, so that tokenizers which
# drop a leading space at the start of a decode (SentencePiece) keep it (vLLM uses 5 too).
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns one request's output tokens into text as they arrive.

    Method (vLLM's ``detokenize_incrementally``, Text Generation Inference's ``decode_token``):
    two offsets into the token ids, ``prefix_offset <= read_offset``. Tokens before
    ``read_offset`` have been emitted as text; each step decodes only the window
    ``prefix_offset:`` and the window ``prefix_offset:read_offset`` and emits the difference. The
    tokens before ``read_offset`` serve as left context, because a token's text can depend on its
    neighbours (leading spaces, bytes of one character split over several tokens). If the window
    ends in U+FFFD, the last character is an incomplete multi-byte sequence: nothing is emitted
    and the offsets stay until a later token completes it. Each step costs a decode of a few
    tokens, never of the whole output.

    Stop strings: each new piece of text goes through the request's Aho-Corasick automaton
    (`StopMatcher`), whose state carries over from step to step, so a stop string is found when
    its last character arrives, even when it spans tokens, at a cost per step linear in the new
    text whatever the number of stop strings. The text is cut before the earliest match (after
    it with ``include_stop_str_in_output``). As in vLLM, stop strings are only searched once more
    than ``min_tokens`` tokens were added. The detokenizer only reports the match; the engine
    ends the sequence through the scheduler (``stop_checker.py`` states every stop rule and where
    each is decided).

    Args:
        tokenizer: a Hugging Face tokenizer (``decode`` is the only method used).
        prompt_token_ids: the request's prompt; its last few tokens are decoding context.
        params: the request's ``stop`` and ``skip_special_tokens``.
        stop_matcher: the automaton of ``params.stop``, built once per request and shared by its
            completions; None builds one.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        params: SamplingParams,
        stop_matcher: StopMatcher | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        matcher = StopMatcher(params.stop) if stop_matcher is None else stop_matcher
        self._stop_scanner = matcher.scanner()
        self.include_stop = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        self.num_output_tokens = 0
        self.skip_special_tokens = params.skip_special_tokens
        self.output_text = ""
        self._token_ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)
        self._stopped = False
        # While running, hold back the characters that could be the start of a stop string, so
        # that streamed text never shows a stop string that is cut later.
        self._holdback = max(matcher.max_len - 1, 0)

    def update(self, token_id: int) -> str | None:
        """Add one output token.

        Returns:
            The stop string found in the output text (which is now cut before it), else None.
            After a stop string, further calls do nothing.
        """
        if self._stopped:
            return None
        self._token_ids.append(token_id)
        self.num_output_tokens += 1
        return self._emit(flush=False)

    def finish(self) -> str | None:
        """Emit any characters still pending because they looked incomplete.

        Call once when the request ends for a reason other than a stop string; the text then
        equals the decode of all output tokens (with the same ``skip_special_tokens``).

        Returns:
            A stop string found in the flushed characters, else None.
        """
        if self._stopped:
            return None
        return self._emit(flush=True)

    def text(self, finished: bool) -> str:
        """The output text to show: all of it once finished, else minus the held-back tail."""
        if finished or self._holdback == 0:
            return self.output_text
        return self.output_text[: max(len(self.output_text) - self._holdback, 0)]

    def _emit(self, flush: bool) -> str | None:
        prefix_text = self._decode(self._token_ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._token_ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or (full_text.endswith("\ufffd") and not flush):
            return None
        new_text = full_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        self.output_text += new_text
        return self._check_stop(new_text)

    def _check_stop(self, new_text: str) -> str | None:
        match = self._stop_scanner.feed(new_text, search=self.num_output_tokens > self.min_tokens)
        if match is None:
            return None
        end = match.start + len(match.stop) if self.include_stop else match.start
        self.output_text = self.output_text[:end]
        self._stopped = True
        return match.stop

    def _decode(self, token_ids: list[int]) -> str:
        # No clean-up of tokenization spaces: it rewrites text across token boundaries, which
        # an incremental decode cannot reproduce.
        return self.tokenizer.decode(
            token_ids,
            skip_special_tokens=self.skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
