"""Log-probs of the engine (``CompletionOutput.logprobs``, ``RequestOutput.prompt_logprobs``)
rendered in OpenAI's formats: the legacy lists of ``/v1/completions`` and the per-token entries
of ``/v1/chat/completions``.

Each position's dict holds the chosen token and the top-ranked ones (``Logprob.rank``, 1 = most
likely). JSON has no ``-inf``: log-probs are floored at -9999.0, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmc.runtime.outputs import Logprob, PositionLogprobs
from llmc.runtime.server.responses import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)

LOGPROB_FLOOR = -9999.0


class TokenTexts:
    """The text of single tokens: ``Logprob.decoded_token`` when the engine filled it in, else
    the tokenizer's decode of the token alone (special tokens kept), cached per token id.

    Args:
        tokenizer: a Hugging Face tokenizer.
        as_ids: name tokens ``"token_id:<id>"`` instead (vLLM's ``return_tokens_as_token_ids``,
            for clients that need the ids, e.g. when a token is part of a UTF-8 character).
    """

    def __init__(self, tokenizer: Any, as_ids: bool = False) -> None:
        self._tokenizer = tokenizer
        self._as_ids = as_ids
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int, logprob: Logprob | None = None) -> str:
        if self._as_ids:
            return f"token_id:{token_id}"
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text


def _floor(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def _ranked(position: PositionLogprobs, num_top: int) -> list[tuple[int, Logprob]]:
    """The ``num_top`` most likely entries of a position, most likely first."""
    top = [(t, lp) for t, lp in position.items() if lp.rank <= num_top]
    return sorted(top, key=lambda item: item[1].rank)


def completion_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs | None],
    num_top: int,
    texts: TokenTexts,
    text_offset: int = 0,
) -> CompletionLogprobs:
    """The legacy format for ``token_ids`` (prompt tokens when echoing, then output tokens).

    Args:
        token_ids: the tokens, in order.
        positions: each token's logprobs (None: no prediction, the first prompt token).
        num_top: alternatives per token (``logprobs`` of the request); the chosen token is
            always in ``top_logprobs`` too, as OpenAI and vLLM do.
        texts: token texts.
        text_offset: character offset of the first token in the choice's text.
    """
    out = CompletionLogprobs()
    for token_id, position in zip(token_ids, positions, strict=True):
        chosen = position.get(token_id) if position is not None else None
        text = texts(token_id, chosen)
        out.tokens.append(text)
        out.text_offset.append(text_offset)
        text_offset += len(text)
        if position is None or chosen is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(_floor(chosen.logprob))
        top = {texts(t, lp): _floor(lp.logprob) for t, lp in _ranked(position, num_top)}
        top.setdefault(text, _floor(chosen.logprob))
        out.top_logprobs.append(top)
    return out


def chat_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs],
    num_top: int,
    texts: TokenTexts,
) -> ChatLogprobs:
    """The chat format for generated ``token_ids``: each token with its log-prob, UTF-8 bytes
    and its ``num_top`` most likely alternatives (``top_logprobs`` of the request)."""
    content = []
    for token_id, position in zip(token_ids, positions, strict=True):
        chosen = position.get(token_id)
        text = texts(token_id, chosen)
        top = [
            TopLogprob(
                token=(t_text := texts(t, lp)),
                logprob=_floor(lp.logprob),
                bytes=list(t_text.encode()),
            )
            for t, lp in _ranked(position, num_top)
        ]
        content.append(
            ChatTokenLogprob(
                token=text,
                logprob=_floor(chosen.logprob) if chosen is not None else LOGPROB_FLOOR,
                bytes=list(text.encode()),
                top_logprobs=top,
            )
        )
    return ChatLogprobs(content=content)
