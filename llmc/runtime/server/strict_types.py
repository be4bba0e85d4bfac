"""Strict scalar types of the request models: no coercion, and text that is valid Unicode.

JSON lets a string hold a lone UTF-16 surrogate (``"\\ud800"``), which Python decodes into a
``str`` that cannot be encoded as UTF-8: the tokenizer, the chat template and the error body
itself would fail on it. Every string field of a request is ``Text``, so such a string is a 400
naming the field before anything else sees it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, Strict


def valid_unicode(value: str) -> str:
    """``value`` unchanged.

    Raises:
        ValueError: when ``value`` holds a lone surrogate (not encodable as UTF-8); the message
            shows it escaped, so the error body can always be encoded.
    """
    if value.isascii():  # O(1) for CPython's compact ASCII strings: a 4 MiB prompt costs nothing
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"must be valid Unicode text, but holds the lone surrogate "
            f"{value[exc.start]!a} at character {exc.start}"
        ) from None
    return value


Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]  # ints are accepted, strings and booleans are not
Bool = Annotated[bool, Strict()]
Text = Annotated[str, Strict(), AfterValidator(valid_unicode)]
TokenId = Annotated[int, Strict(), Field(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
