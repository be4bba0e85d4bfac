"""``llmc registry ls|show|resolve|push|pull|rm|verify|gc|keygen``: parse, call, print."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from llmc.registry.local import DEFAULT_GC_GRACE_S, DEFAULT_ROOT
from llmc.registry.trusted_state import TrustedState, default_state_dir

TRUSTED_STATE_HELP = (
    "with --verify-key: where this host remembers the newest signed version of each model it "
    "verified, to refuse a registry rolled back to an older engine (default: "
    "$XDG_STATE_HOME/llmc/trusted or ~/.local/state/llmc/trusted)"
)


def default_root() -> str:
    """The local registry root: ``$LLMC_REGISTRY``, else ``engines``."""
    return os.environ.get("LLMC_REGISTRY") or DEFAULT_ROOT


def trusted_state(directory: str | None) -> TrustedState:
    """The trusted state in ``directory`` (``--trusted-state``), else in this host's default."""
    return TrustedState(Path(directory) if directory else default_state_dir())


def add_parser(sub) -> None:
    """Add ``registry`` and its subcommands to the ``llmc`` subparsers ``sub``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--registry",
        default=default_root(),
        help="local registry root (default: $LLMC_REGISTRY or engines)",
    )
    p = sub.add_parser("registry", help="list, resolve, push and pull engines in a registry")
    cmds = p.add_subparsers(dest="registry_command", required=True)
    ls = cmds.add_parser("ls", parents=[common], help="list the engines")
    ls.add_argument("--json", action="store_true", help="one JSON entry per line")
    _add_remote(ls, required=False)
    show = cmds.add_parser("show", parents=[common], help="print an engine's entry and manifest")
    show.add_argument("ref", help="model id, digest prefix or MODEL@PREFIX")
    res = cmds.add_parser(
        "resolve", parents=[common], help="the engine of MODEL that fits this host, or why none"
    )
    res.add_argument("model")
    _add_selection(res)
    res.add_argument("--verify-key", help="Ed25519 public key (PEM) the engine must be signed by")
    res.add_argument("--trusted-state", metavar="DIR", help=TRUSTED_STATE_HELP)
    push = cmds.add_parser(
        "push", parents=[common], help="publish an engine directory, and/or upload to --remote"
    )
    push.add_argument("source", help="engine directory, or an engine of the local registry")
    _add_remote(push, required=False)
    push.add_argument("--sign-key", help="Ed25519 private key (PEM) to sign the manifest with")
    push.add_argument(
        "--expires-in",
        type=float,
        metavar="DAYS",
        help="with --sign-key: hosts verifying the signature refuse the engine after DAYS days, "
        "so a registry frozen at an old state cannot serve it forever; re-sign before then",
    )
    pull = cmds.add_parser("pull", parents=[common], help="download MODEL's engine for this host")
    pull.add_argument("model")
    _add_remote(pull, required=True)
    _add_selection(pull)
    pull.add_argument("--verify-key", help="Ed25519 public key (PEM) the engine must be signed by")
    pull.add_argument("--trusted-state", metavar="DIR", help=TRUSTED_STATE_HELP)
    rm = cmds.add_parser("rm", parents=[common], help="remove engines from the index (see gc)")
    rm.add_argument("ref")
    verify = cmds.add_parser(
        "verify",
        parents=[common],
        help="re-hash every blob and checkout of the engines (exit code 1 on a problem)",
    )
    verify.add_argument("ref", nargs="?", default=None)
    gc = cmds.add_parser("gc", parents=[common], help="delete blobs no engine references")
    gc.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GC_GRACE_S,
        help=f"keep files younger than this, seconds (default {DEFAULT_GC_GRACE_S:g})",
    )
    keygen = cmds.add_parser("keygen", help="write an Ed25519 key pair: KEY and KEY.pub")
    keygen.add_argument("key", help="private key path")


def _add_selection(p) -> None:
    p.add_argument("--target", default=None, help="only engines for this target (cpu, sm90...)")
    p.add_argument("--quant", default=None, help="only engines of this quantization")
    p.add_argument("--dtype", default=None, help="only engines of this dtype")


def _add_remote(p, required: bool) -> None:
    p.add_argument("--remote", required=required, help="remote registry, s3://BUCKET/PREFIX")
    p.add_argument(
        "--endpoint-url", default=None, help="S3-compatible endpoint (default: $AWS_ENDPOINT_URL)"
    )


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``llmc registry`` command; returns the exit code."""
    from llmc.registry.local import LocalRegistry
    from llmc.registry.resolve import Selection, describe
    from llmc.registry.rollback import describe_release

    command = args.registry_command
    if command == "keygen":
        from llmc.registry.signing import generate_keypair

        print(f"private key: {args.key}\npublic key: {generate_keypair(args.key)}")
        return 0
    local = LocalRegistry(args.registry)
    if command == "ls":
        if args.remote:
            from llmc.registry.s3 import S3Registry

            return _print_entries(S3Registry(args.remote, args.endpoint_url).entries(), args.json)
        return _print_entries(local.entries(), args.json)
    if command == "show":
        entry = local.get(args.ref)
        manifest = json.loads(local.manifest_bytes(entry))
        print(json.dumps({"entry": entry.to_dict(), "manifest": manifest}, indent=2))
        return 0
    if command in ("resolve", "pull"):
        selection = Selection(args.target, args.quant, args.dtype)
        trusted = trusted_state(args.trusted_state)
        if command == "resolve":
            from llmc.registry.resolve import resolve_local

            entry = resolve_local(local, args.model, selection, args.verify_key, trusted)
        else:
            from llmc.registry.transfer import pull

            entry = pull(
                local,
                args.model,
                args.remote,
                args.endpoint_url,
                selection,
                args.verify_key,
                trusted,
            )
        print(describe(entry))
        print(f"release: {describe_release(entry)}")
        print(f"engine: {local.checkout(entry)}")
        return 0
    if command == "push":
        from llmc.registry.transfer import push

        entry = push(
            local, args.source, args.remote, args.endpoint_url, args.sign_key, args.expires_in
        )
        where = args.remote or str(local.root)
        signed = " (signed)" if entry.signature else ""
        print(f"pushed {describe(entry)} to {where}{signed}: {describe_release(entry)}")
        return 0
    if command == "rm":
        for entry in local.remove(args.ref):
            print(f"removed {describe(entry)}")
        return 0
    if command == "verify":
        problems = local.verify(args.ref)
        for problem in problems:
            print(f"{describe(problem.entry)}: {problem.message}", file=sys.stderr)
        checked = len(local.find(args.ref) if args.ref else local.entries())
        print(f"{checked} engine(s) checked, {len(problems)} problem(s)")
        return 1 if problems else 0
    if command == "gc":
        r = local.gc(args.grace)
        print(
            f"removed {r.blobs_removed} blob(s) ({r.bytes_freed} bytes), "
            f"{r.checkouts_removed} checkout(s), {r.partials_removed} temporary file(s)"
        )
        return 0
    raise AssertionError(command)  # argparse allows only the commands above


def _print_entries(entries, as_json: bool) -> int:
    if as_json:
        for entry in entries:
            print(json.dumps(entry.to_dict()))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(
        "model", "id", "version", "target", "isa", "dtype", "quant", "backend", "MB", "signed"
    )
    for e in entries:
        table.add_row(
            e.model_id,
            e.short_id,
            str(e.version or "-"),
            e.target,
            "+".join(e.isa) or "-",
            e.dtype,
            e.quant,
            f"{e.backend} {e.backend_version}",
            f"{e.size_bytes / 1e6:.1f}",
            "yes" if e.signature else "no",
        )
    Console().print(table)
    return 0
