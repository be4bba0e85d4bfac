"""The prompt of a conversation: the tokenizer's chat template applied to its messages.

The one place llmc applies a chat template: ``LLM.chat`` (and ``llmc generate --chat``) and the
server's ``/v1/chat/completions`` both come here.
"""

from __future__ import annotations

from typing import Any

#: Chat prompts are encoded without the tokenizer's special tokens: the template writes every
#: special token the model expects (BOS included, when the model uses one), and encoding with
#: them would add a second BOS.
CHAT_ADD_SPECIAL_TOKENS = False


class ChatTemplateError(ValueError):
    """The messages do not fit the model's chat template, or the tokenizer has none."""


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt text of a conversation, ready for the assistant's reply (without the
    assistant's header when ``add_generation_prompt`` is false).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: the conversation, oldest first, as the template takes them
            (``{"role": "user", "content": "Hi"}``).
        add_generation_prompt: end with the header of the assistant's turn.
        tools: the template's ``tools`` (OpenAI's function tools), for a template that renders
            them itself; None passes none.

    Returns:
        ``tokenizer.apply_chat_template(messages, add_generation_prompt=...)`` as text; encode
        it with ``add_special_tokens=CHAT_ADD_SPECIAL_TOKENS`` (`encode_chat`).

    Raises:
        ChatTemplateError: the template refused the messages (``jinja2.TemplateError``,
            ``ValueError``, a missing template ...); the message gives the template's reason.
    """
    try:
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, tools=tools
        )
    except Exception as exc:  # a template may raise anything: report it as the messages' fault
        raise ChatTemplateError(f"Cannot apply the chat template: {exc}") from exc


def encode_chat(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt token ids of a conversation (`render_chat`, then encoded).

    Raises:
        ChatTemplateError: as `render_chat`.
    """
    text = render_chat(tokenizer, messages)
    return tokenizer.encode(text, add_special_tokens=CHAT_ADD_SPECIAL_TOKENS)
