"""The ``llmc bench`` command line: flags generated from `BenchConfig`, then run and report."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from llmc.bench.config import BenchConfig

_TYPES = {"str": str, "int": int, "float": float}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per `BenchConfig` field (``--input-len`` for ``input_len``...), plus ``--json``."""
    for f in fields(BenchConfig):
        flag = f"--{f.name.replace('_', '-')}"
        default = None if f.default is MISSING else f.default
        help_text = f"{f.metadata['help']} (default: {default})".replace("%", "%%")
        if f.type == "bool":
            parser.add_argument(flag, dest=f.name, action="store_true", help=help_text)
            continue
        parser.add_argument(
            flag,
            dest=f.name,
            type=_TYPES[str(f.type).removesuffix(" | None")],
            choices=f.metadata.get("choices"),
            default=default,
            help=help_text,
        )
    parser.add_argument("--json", dest="json_path", default=None, help="write the results here")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark the parsed flags describe; print the table, write ``--json``.

    Returns:
        0 when every request succeeded (or was disconnected on purpose), 1 when any failed.
    """
    from rich.console import Console

    from llmc.bench.report import result_table, write_json
    from llmc.bench.runner import run_bench

    config = BenchConfig(**{f.name: getattr(args, f.name) for f in fields(BenchConfig)})
    bench_run = run_bench(config)
    Console().print(result_table(bench_run))
    if args.json_path:
        write_json(bench_run, args.json_path)
    return 1 if bench_run.result.failed else 0
