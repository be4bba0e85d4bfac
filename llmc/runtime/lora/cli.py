"""``llmc lora``: store LoRA adapters with an engine built with ``--enable-lora`` and list them
(``stored.py``)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    """Add ``llmc lora add|ls`` to the ``llmc`` subcommands ``sub``."""
    p = sub.add_parser(
        "lora",
        help="store LoRA adapters with an engine built with --enable-lora",
        description="Adapters stored with an engine (lora/NAME/ in its directory) are loaded "
        "with it under their names and published, signed, with it by `llmc registry`.",
    )
    lora = p.add_subparsers(dest="lora_command", required=True)
    add = lora.add_parser("add", help="check a PEFT adapter against the engine and store it")
    add.add_argument("engine", help="engine directory built with --enable-lora")
    add.add_argument("name", help="the adapter's name (requests give it as model)")
    add.add_argument("path", help="PEFT directory: adapter_config.json, adapter_model.safetensors")
    ls = lora.add_parser("ls", help="list the adapters stored with an engine")
    ls.add_argument("engine", help="engine directory")


def run(args: argparse.Namespace) -> int:
    """Run ``llmc lora add|ls``; the exit code. Raises LoRAAdapterError (exit 2 from ``main``)
    for an adapter the engine cannot serve."""
    from llmc.runtime.lora.stored import store_adapter, stored_lora_requests

    if args.lora_command == "add":
        adapter = store_adapter(args.engine, args.name, args.path)
        print(f"stored {adapter.name}: rank {adapter.rank}, {len(adapter.weights)} modules")
        return 0
    for request in stored_lora_requests(args.engine):
        print(f"{request.lora_name}\t{request.lora_path}")
    return 0
