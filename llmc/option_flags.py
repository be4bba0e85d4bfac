"""Command-line flags derived from option dataclasses: the one builder of ``llmc build`` and
``llmc serve`` flags (and any later command whose options are dataclass fields).

A field becomes ``--field-name`` (or ``metadata["flag"]``, plus ``metadata["aliases"]``) with its
``metadata["help"]``, its ``choices`` and a type read from its hint; ``bool`` fields become
switches that flip their default, ``list`` fields repeatable flags. A flag not given is absent
from the parsed namespace (``argparse.SUPPRESS``), so a ``--config`` file's value or the default
applies: defaults < YAML file < command line.
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import Field, fields
from typing import Any


def alternatives(hint: Any) -> tuple[Any, ...]:
    """The types a field's type hint allows: ``int | None`` -> (int, NoneType)."""
    return typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)


def add_option_flags(group: Any, options: type, skip: tuple[str, ...] = ()) -> None:
    """Add one flag per field of the dataclass ``options`` (but ``skip``) to ``group`` (a
    parser or an argument group)."""
    hints = typing.get_type_hints(options)
    for f in fields(options):
        if f.name not in skip:
            add_flag(group, f, hints[f.name])


def add_flag(group: Any, f: Field, hint: Any) -> None:
    """Add the flag of field ``f`` (type hint ``hint``) to ``group``; see the module docstring."""
    meta = f.metadata
    names = [meta.get("flag") or "--" + f.name.replace("_", "-"), *meta.get("aliases", ())]
    kind = next(k for k in alternatives(hint) if k is not type(None))
    help = meta["help"]
    options: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS}
    if kind is bool:
        options["action"] = "store_false" if f.default else "store_true"
        help += "; this flag turns it off" if f.default else ""
    elif typing.get_origin(kind) is list and meta.get("nargs"):  # vLLM's `--flag A B ...`
        options |= {"action": "extend", "nargs": meta["nargs"], "metavar": meta.get("metavar")}
    elif typing.get_origin(kind) is list:
        options |= {"action": "append", "metavar": meta.get("metavar")}
    else:
        metavar = meta.get("metavar") or ("N" if kind is int else None)
        options |= {"type": kind, "choices": meta.get("choices"), "metavar": metavar}
        if f.default is not None:
            help += f" (default: {f.default})"
    group.add_argument(*names, help=help.replace("%", "%%"), **options)
