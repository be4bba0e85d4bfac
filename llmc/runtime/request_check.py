"""Whether the engine can serve a request: the one check every request goes through.

`LLMEngine.add_request` calls `check_request` for every entry point (``LLM.generate``, the
server, a caller of the engine itself); the server turns its `InvalidRequestError` into a 400
naming ``field`` and its ``ContextLengthError`` into OpenAI's ``context_length_exceeded``. The
server's own bounds on a request's cost (``RequestLimits``: how many stop strings, ``n``, ...)
are a policy of the server, checked before the prompt is tokenized; what is checked here is
what any request must satisfy for the engine to run it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llmc.errors import ContextLengthError
from llmc.runtime.errors import InvalidRequestError

if TYPE_CHECKING:
    from llmc.runtime.sampling_params import SamplingParams


def check_request(
    prompt_token_ids: Sequence[int], params: SamplingParams, vocab_size: int, max_model_len: int
) -> None:
    """Check a request against its own rules and the model's limits.

    Args:
        prompt_token_ids: the prompt, as token ids.
        params: how to sample it (`SamplingParams.validate` checks each field).
        vocab_size: the model's vocabulary size; token ids are in ``[0, vocab_size)``.
        max_model_len: the engine's longest sequence (prompt + output), tokens.

    Raises:
        InvalidRequestError: a bad sampling parameter, an empty prompt, or a prompt token or
            stop token id outside the vocabulary; ``field`` names the culprit.
        ContextLengthError: (a ValueError) the prompt plus ``max_tokens`` is longer than
            ``max_model_len``; it carries ``limit`` and ``num_tokens``.
    """
    params.validate()
    if len(prompt_token_ids) == 0:
        raise InvalidRequestError("the prompt is empty: it must have at least one token", "prompt")
    check_vocabulary("prompt", prompt_token_ids, vocab_size)
    check_vocabulary("stop_token_ids", params.stop_token_ids, vocab_size)
    total = len(prompt_token_ids) + params.max_tokens
    if total > max_model_len:
        raise ContextLengthError(
            f"the prompt ({len(prompt_token_ids)} tokens) plus max_tokens "
            f"({params.max_tokens}) is {total} tokens, more than this engine's max_model_len "
            f"of {max_model_len}; shorten the prompt or lower max_tokens",
            limit=max_model_len,
            num_tokens=total,
        )


def check_vocabulary(field: str, token_ids: Sequence[int], vocab_size: int) -> None:
    """Raise InvalidRequestError naming ``field`` when a token id is outside
    ``[0, vocab_size)``."""
    if len(token_ids) == 0:
        return
    lo, hi = min(token_ids), max(token_ids)
    if lo < 0 or hi >= vocab_size:
        raise InvalidRequestError(
            f"{field}: token id {lo if lo < 0 else hi} is outside the vocabulary "
            f"[0, {vocab_size}); this model's vocabulary size is {vocab_size}",
            field,
        )
