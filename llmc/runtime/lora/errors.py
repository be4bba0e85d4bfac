"""The errors of adapter loading and choice: a bad adapter is the caller's error (400), an
unknown one a 404."""

from __future__ import annotations

from llmc.runtime.errors import InvalidRequestError


class LoRAAdapterError(InvalidRequestError):
    """An adapter this engine cannot serve: not a PEFT LoRA directory, a rank past the slots',
    a module without slots, shapes of another model."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "lora_request")


class LoRANotFoundError(LookupError):
    """No adapter of that name is loaded (the server's 404)."""
