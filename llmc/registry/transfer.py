"""Push and pull: move engines between a build directory, the local registry and a remote one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from llmc.errors import RegistryError
from llmc.registry.index import IndexEntry
from llmc.registry.local import LocalRegistry
from llmc.registry.resolve import Selection, choose, judge, versions_seen
from llmc.registry.rollback import highest_versions
from llmc.registry.signing import sign_entry
from llmc.registry.trusted_state import TrustedState


def push(
    local: LocalRegistry,
    source: str,
    remote: str | None = None,
    endpoint_url: str | None = None,
    sign_key: str | Path | None = None,
    expires_in_days: float | None = None,
) -> IndexEntry:
    """Publish ``source`` and, with ``remote`` (``s3://bucket/prefix``), upload it there.

    ``source`` is an engine directory (published into ``local`` first) or a reference to an
    entry of ``local`` (model id, digest prefix, MODEL@PREFIX). ``sign_key`` (Ed25519 private
    key, PEM) signs the entry (every field, see ``IndexEntry.signed_payload``); the signature is
    kept in the local and remote entries. A push that signs, or that publishes or uploads an
    unsigned entry, is a new release (``LocalRegistry.release``): the entry gets the next
    version of its model, above the remote's highest too, so a runner with an empty local
    registry does not release an engine that looks older than the remote's. With
    ``expires_in_days`` the signature covers an expiry that many days from now (rollback.py).
    A signed entry uploaded without the key goes up as it is, its version and signature kept.

    Raises:
        RegistryError: ``source`` is neither, or names several entries; nothing to do; or
            ``expires_in_days`` is given without ``sign_key``.
        BlobCorruptError: an engine file differs from its manifest digest.
        SignatureError: the key cannot be read.
        EngineCorruptError: the local entry disagrees with its manifest; nothing is signed.
    """
    if expires_in_days is not None and sign_key is None:
        raise RegistryError(
            "--expires-in needs --sign-key: an expiry is kept only where a signature covers it"
        )
    path = Path(source)
    if (path / "manifest.json").is_file():
        entry = local.store(path)
    elif path.exists():
        raise RegistryError(f"{source} is not an engine directory (no manifest.json)")
    else:
        entry = local.get(source)
        if remote is None and sign_key is None:
            raise RegistryError(
                f"{source!r} is already in the registry {local.root}; give --remote s3://... to "
                "upload it, or --sign-key to sign it"
            )
    registry = None
    if remote is not None:
        from llmc.registry.s3 import S3Registry

        registry = S3Registry(remote, endpoint_url)
    if sign_key is not None or entry.signature is None:
        sign = None
        if sign_key is not None:
            local.manifest_bytes(entry)  # sign only an entry that agrees with its intact manifest
            sign = partial(sign_entry, private_key_path=sign_key)
        above = highest_versions(registry.entries()).get(entry.model_id) if registry else None
        entry = local.release(entry, sign, _expiry(expires_in_days), above)
    if registry is not None:
        entry = registry.push(local, entry, entry.signature)
    return entry


def _expiry(days: float | None) -> str | None:
    if days is None:
        return None
    return (datetime.now(UTC) + timedelta(days=days)).isoformat(timespec="seconds")


def pull(
    local: LocalRegistry,
    model: str,
    remote: str,
    endpoint_url: str | None = None,
    selection: Selection | None = None,
    verify_key: str | Path | None = None,
    trusted: TrustedState | None = None,
) -> IndexEntry:
    """Download the engine of ``model`` at ``remote`` that fits this host into ``local``; with
    ``verify_key`` and ``trusted``, a rolled-back remote is refused (rollback.py).

    Raises:
        NoMatchingEngineError: no remote engine of ``model`` fits (each candidate's reason).
        RegistryError: the trusted state is damaged (see ``TrustedState``).
        BlobCorruptError, SignatureError, EngineCorruptError: see ``S3Registry.pull``; nothing
            is left in ``local`` then.
    """
    from llmc.registry.s3 import S3Registry

    registry = S3Registry(remote, endpoint_url)
    found = registry.find(model)
    versions = versions_seen(registry, found, verify_key, trusted)
    candidates = judge(found, registry.manifest_bytes, selection, verify_key, versions=versions)
    entry = choose(model, candidates, remote)
    return registry.pull(local, entry, verify_key)
