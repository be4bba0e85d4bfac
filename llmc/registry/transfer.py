"""Push and pull: move engines between a build directory, the local registry and a remote one."""

from __future__ import annotations

from pathlib import Path

from llmc.errors import RegistryError
from llmc.registry.index import IndexEntry
from llmc.registry.local import LocalRegistry
from llmc.registry.resolve import Selection, choose, judge
from llmc.registry.signing import sign_entry


def push(
    local: LocalRegistry,
    source: str,
    remote: str | None = None,
    endpoint_url: str | None = None,
    sign_key: str | Path | None = None,
) -> IndexEntry:
    """Publish ``source`` and, with ``remote`` (``s3://bucket/prefix``), upload it there.

    ``source`` is an engine directory (published into ``local`` first) or a reference to an
    entry of ``local`` (model id, digest prefix, MODEL@PREFIX). ``sign_key`` (Ed25519 private
    key, PEM) signs the entry (every field, see ``IndexEntry.signed_payload``); the signature is
    kept in the local and remote entries.

    Raises:
        RegistryError: ``source`` is neither, or names several entries; nothing to do.
        BlobCorruptError: an engine file differs from its manifest digest.
        SignatureError: the key cannot be read.
        EngineCorruptError: the local entry disagrees with its manifest; nothing is signed.
    """

    path = Path(source)
    if (path / "manifest.json").is_file():
        entry = local.publish(path)
    elif path.exists():
        raise RegistryError(f"{source} is not an engine directory (no manifest.json)")
    else:
        entry = local.get(source)
        if remote is None and sign_key is None:
            raise RegistryError(
                f"{source!r} is already in the registry {local.root}; give --remote s3://... to "
                "upload it, or --sign-key to sign it"
            )
    if sign_key is not None:
        from dataclasses import replace

        local.manifest_bytes(entry)  # sign only an entry that agrees with its intact manifest
        entry = local.add(replace(entry, signature=sign_entry(entry, sign_key)))
    if remote is not None:
        from llmc.registry.s3 import S3Registry

        entry = S3Registry(remote, endpoint_url).push(local, entry, entry.signature)
    return entry


def pull(
    local: LocalRegistry,
    model: str,
    remote: str,
    endpoint_url: str | None = None,
    selection: Selection | None = None,
    verify_key: str | Path | None = None,
) -> IndexEntry:
    """Download the engine of ``model`` at ``remote`` that fits this host into ``local``.

    Raises:
        NoMatchingEngineError: no remote engine of ``model`` fits (each candidate's reason).
        BlobCorruptError, SignatureError, EngineCorruptError: see ``S3Registry.pull``; nothing
            is left in ``local`` then.
    """
    from llmc.registry.s3 import S3Registry

    registry = S3Registry(remote, endpoint_url)
    candidates = judge(registry.find(model), registry.manifest_bytes, selection, verify_key)
    entry = choose(model, candidates, remote)
    return registry.pull(local, entry, verify_key)
