"""Tokenize a prompt with bounded work: a text that certainly holds more tokens than the model
takes is refused after tokenizing a prefix of it, not the whole.

A Hugging Face tokenizer holds the GIL while it encodes (``Tokenizer.encode`` does not release
it), so one 4 MiB prompt (about a million tokens, seconds on these cores) stalls the event loop's
thread for as long, even from a worker thread. Encoding long texts in pieces of `PIECE_CHARS`
hands the GIL back between pieces, and counting stops as soon as the pieces prove the prompt too
long.

Why the count of the pieces is a safe lower bound: cutting a text changes only the tokens that
span a cut (merge-based tokenizers, BPE and SentencePiece, merge adjacent symbols; a cut removes
the merges across it and so can only add tokens there, a handful per cut). The refusal below
allows a factor of two plus `SLACK_PER_CUT` tokens per cut on top of that, so no prompt that
fits is refused; a prompt that passes is then encoded whole, for its exact ids, at a cost bounded
by about twice the model's context.
"""

from __future__ import annotations

from collections.abc import Callable

from llmc.errors import ContextLengthError

PIECE_CHARS = 16_384
SLACK_PER_CUT = 16


def encode_bounded(
    encode: Callable[[str], list[int]],
    count: Callable[[str], int],
    text: str,
    max_model_len: int,
) -> list[int]:
    """The token ids of ``text``, or a refusal once it is certainly longer than the model.

    Args:
        encode: the exact encoding of a whole prompt (special tokens as the caller wants them).
        count: the number of tokens of a piece of text, without special tokens.
        text: the prompt.
        max_model_len: the engine's context length in tokens.

    Returns:
        ``encode(text)``, list of int token ids.

    Raises:
        ContextLengthError: the pieces of ``text`` already hold more than
            ``2 * max_model_len + SLACK_PER_CUT * cuts`` tokens (``num_tokens`` is that count,
            a lower bound on the prompt's length up to the slack).
    """
    if len(text) <= PIECE_CHARS:
        return encode(text)
    counted = 0
    for cut, start in enumerate(range(0, len(text), PIECE_CHARS)):
        counted += count(text[start : start + PIECE_CHARS])
        if counted > 2 * max_model_len + SLACK_PER_CUT * cut:
            raise ContextLengthError(
                f"This model's maximum context length is {max_model_len} tokens; the prompt "
                f"holds more than {counted - SLACK_PER_CUT * cut} tokens.",
                limit=max_model_len,
                num_tokens=counted,
            )
    return encode(text)
