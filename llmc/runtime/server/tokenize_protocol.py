"""Bodies of ``POST /tokenize`` and ``POST /detokenize``, in vLLM's shapes, so clients can count
a prompt's tokens against the model's limit before they send it.

``/tokenize`` takes a completion prompt (``prompt``, ``add_special_tokens`` default true) or a
conversation (``messages`` rendered by the chat template, ``add_generation_prompt`` default
true, ``add_special_tokens`` default false, as ``/v1/chat/completions`` encodes it), and answers
``count``, ``max_model_len``, ``tokens`` and, with ``return_token_strs``, each token's text.
``/detokenize`` takes ``tokens`` and answers ``prompt``. ``model`` is optional; another model's
name is a 404. Fields are strict as in ``protocol.py``; any other field is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidatorFunctionWrapHandler, WrapValidator

from llmc.runtime.chat_template import CHAT_ADD_SPECIAL_TOKENS
from llmc.runtime.server.chat_messages import ChatMessage
from llmc.runtime.server.strict_types import Bool, Text, TokenIds


class TokenizeCompletionRequest(BaseModel):
    """``/tokenize`` of a completion prompt."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = None
    prompt: Text
    add_special_tokens: Bool = True
    return_token_strs: Bool = False


class TokenizeChatRequest(BaseModel):
    """``/tokenize`` of a conversation, as ``/v1/chat/completions`` would encode it."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: Bool = True
    add_special_tokens: Bool = CHAT_ADD_SPECIAL_TOKENS
    return_token_strs: Bool = False


def _by_fields(value: Any, _: ValidatorFunctionWrapHandler) -> Any:
    """The body as a conversation when it has ``messages``, else as a prompt.

    One model validates it, not the union: a union reports each member's errors under the
    member's class name (``TokenizeCompletionRequest.foo``), which would become the 400's
    ``param``; one model's errors are located at the request's own fields.
    """
    if isinstance(value, TokenizeCompletionRequest | TokenizeChatRequest):
        return value
    chat = isinstance(value, dict) and "messages" in value
    return (TokenizeChatRequest if chat else TokenizeCompletionRequest).model_validate(value)


# The union stays the declared type: it is the body's schema in the OpenAPI document.
TokenizeRequest = Annotated[
    TokenizeCompletionRequest | TokenizeChatRequest, WrapValidator(_by_fields)
]


class TokenizeResponse(BaseModel):
    """``count`` tokens ``tokens`` (ids); ``token_strs`` their texts when asked for."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    """``/detokenize``: token ids, each in the vocabulary."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = None
    tokens: TokenIds


class DetokenizeResponse(BaseModel):
    """The text of the token ids."""

    prompt: str
