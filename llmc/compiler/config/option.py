"""``option``: one build option's field (default, ``--help`` text, choices), and the checks
every option group runs on its fields."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import field, fields
from typing import Any

from llmc.config_file import short_repr
from llmc.errors import BuildConfigError


def option(
    default: Any, help: str, choices: Iterable | None = None, aliases: tuple[str, ...] = ()
) -> Any:
    """A dataclass field of an option group: ``default``, the ``llmc build --help`` text,
    when given the values ``validate`` accepts (any container, read at each check), and short
    flags besides ``--name`` (``llmc.option_flags``)."""
    return field(default=default, metadata={"help": help, "choices": choices, "aliases": aliases})


def flag(name: str) -> str:
    """The command-line flag of option ``name`` (``block_size`` -> ``--block-size``)."""
    return "--" + name.replace("_", "-")


def check_choices(group: Any) -> None:
    """Raise BuildConfigError naming the first option of ``group`` whose value is not one of
    its choices (None passes: it means the default)."""
    for f in fields(group):
        choices = f.metadata.get("choices")
        value = getattr(group, f.name)
        if choices and value is not None and value not in choices:
            raise BuildConfigError(
                f"{flag(f.name)} {short_repr(value)} is not one of {', '.join(map(str, choices))}"
            )


def check_at_least(group: Any, minimum: int, *names: str) -> None:
    """Raise BuildConfigError for the first option of ``names`` below ``minimum``."""
    for name in names:
        if getattr(group, name) < minimum:
            raise BuildConfigError(f"{flag(name)} must be >= {minimum}")
