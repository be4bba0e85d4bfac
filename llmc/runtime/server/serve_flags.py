"""``llmc serve``'s command line, derived from `ServeConfig`: one flag per field (its name with
dashes, its help and default), one argument group per concern, plus ``--config`` and
``--print-config``."""

from __future__ import annotations

import argparse
from typing import Any

from llmc.option_flags import add_option_flags
from llmc.runtime.server.serve_config import OPTION_GROUPS, OPTION_NAMES, ServeConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``llmc serve``'s options: ``--config``, ``--print-config`` and one flag per
    `ServeConfig` field, in one argument group per concern. A flag not given is absent from
    the parsed namespace (`cli_values`), so the YAML file's value or the default applies."""
    parser.add_argument(
        "--config",
        metavar="YAML",
        help="YAML file setting any option below by its name (port: 9000, max_num_seqs: 8, ...); "
        "flags win",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved options as YAML and exit"
    )
    for group, kind in OPTION_GROUPS:
        args = parser.add_argument_group(group.metadata["title"], group.metadata["description"])
        add_option_flags(args, kind)


def cli_values(args: argparse.Namespace) -> dict[str, Any]:
    """The `ServeConfig` options given on the command line (parsed by `add_arguments`)."""
    given = vars(args)
    return {name: given[name] for name in OPTION_NAMES if name in given}


def from_args(args: argparse.Namespace) -> ServeConfig:
    """The config of a parsed ``llmc serve`` command line: defaults < ``--config`` < flags.

    Raises:
        EngineConfigError: as `ServeConfig.from_sources`.
    """
    return ServeConfig.from_sources(args.config, cli_values(args))
