"""``opt``: one documented ``llmc serve`` option, the field every serve config group is made
of (its help, choices, flag and metavar become the command's flag, ``serve_flags.py``)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def opt(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    nargs: str | None = None,
) -> Any:
    """A documented option; ``flag`` replaces the derived ``--name-with-dashes``; ``nargs``
    ("+") lets a list option take several values after one flag, as vLLM's do."""
    metadata = {"help": help, "choices": choices, "flag": flag, "metavar": metavar, "nargs": nargs}
    return field(default=default, metadata=metadata)
