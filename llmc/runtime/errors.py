"""The runtime's errors a caller handles: a request the engine cannot serve."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine cannot serve.

    Attributes:
        field: the `SamplingParams` field at fault, or ``"prompt"``; None when no one field is.
    """

    def __init__(self, message: str, field: str | None) -> None:
        super().__init__(message)
        self.field = field
