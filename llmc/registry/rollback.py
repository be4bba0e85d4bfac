"""Signed entries cannot be rolled back or frozen unnoticed (TUF's rollback and freeze attacks).

Whoever can write a registry or serve it (an S3 bucket, a shared directory, a mirror) but lacks
the signing key cannot forge an entry, yet can still delete or withhold the newest one, so that
an older, validly signed engine is served: the *rollback attack* of The Update Framework's
specification (theupdateframework.io/specification, "Rollback attacks"). Or keep serving the
registry as it was, so that a host never learns of a newer engine: its *freeze attack*. TUF
refuses both with metadata that carries a signed, increasing ``version`` and an ``expires``
time, and a client that remembers the newest version it trusted.

Design: every release of an engine (a publish, a push that signs, an upload of an unsigned
entry) gets the next ``version`` of its model: one more than the highest the local registry ever
gave that model (its index keeps that number, so removing the newest entry never lets a version
be given twice) and than the highest the remote it goes to holds. The version, and an optional
``expires``, are fields of the entry, covered by its signature. A host resolving with a verify
key verifies the entries of the model, raises its trusted state (trusted_state.py) to the newest
verified version, and, when that is below the version it had seen, refuses every candidate:
"version 3 of gemma-3-270m is older than version 5 this host has seen; a newer entry was
withheld or deleted". An entry past its ``expires`` is refused. Among fitting engines a higher
version is preferred to a newer build time, so a re-signed engine (a revert) wins over the one
it replaces.

Why one number per model and not TUF's snapshot (a signed list of every live entry, rewritten on
each release): a snapshot needs one object every publisher rewrites, under a lock that S3 does
not offer, and the CI matrix publishes a model's targets concurrently; a lost update would hide
a new engine. Per-model versions need no shared object: two pushes racing to S3 may share a
number, and both are still newer than every release before them. What this leaves open:
withholding an engine of a model that is not its newest (the avx512 build, while a newer sm90
one stays visible) makes a host fall back to the best remaining signed engine; a snapshot would
name the missing one. And a remote's versions are given from what the publisher sees: one who
pushes from a fresh runner right after an attacker deleted the newest entry from the bucket
gives its number again (hosts refuse to resolve in between, which shows it).

Entries released before versions existed verify as they did (their signature does not cover a
version) and resolve while this host has seen no versioned entry of their model;
``describe_release`` calls them unversioned. Without a verify key nothing is authenticated
(whoever can write the registry can write any version), so versions and expiry are shown but
neither enforced nor remembered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from llmc.errors import SignatureError
from llmc.registry.entry import IndexEntry
from llmc.registry.signing import verify_entry
from llmc.registry.trusted_state import TrustedState

_FIX = (
    "Refusing to roll back. If its publisher removed it, re-sign the engine to serve (`llmc "
    "registry push REF --sign-key KEY`): that gives it a newer version"
)


@dataclass(frozen=True)
class VersionCheck:
    """A registry's signed versions held against what this host had seen of it.

    ``newest``: model id -> the highest version among the entries whose signature verified now;
    ``seen``: model id -> the highest this host had verified before; ``state_file``: where that
    is kept (named in refusals)."""

    newest: dict[str, int]
    seen: dict[str, int]
    state_file: Path

    def reason(self, entry: IndexEntry) -> str | None:
        """Why ``entry`` is refused as a rollback, or None: its model's newest verified version
        is at least the one seen (or none was seen)."""
        seen = self.seen.get(entry.model_id)
        if seen is None or self.newest.get(entry.model_id, 0) >= seen:
            return None
        if entry.version is None:
            this = (
                f"{entry.model_id}@{entry.short_id} is unversioned, and this host has seen "
                f"version {seen} of {entry.model_id}"
            )
        else:
            this = (
                f"version {entry.version} of {entry.model_id} is older than version {seen} this "
                "host has seen"
            )
        return f"{this} ({self.state_file}); a newer entry was withheld or deleted. {_FIX}"


def check_versions(
    entries: Iterable[IndexEntry], verify_key: str | Path, trusted: TrustedState, registry: str
) -> VersionCheck:
    """Verify the signature of each model's versioned entries, newest first, until one verifies;
    raise ``trusted``'s record of ``registry`` (its ``identity``) to those versions; return them
    with what was seen before. Pass every entry of the models resolved, not only the ones a
    reference picked, so that pinning an older engine is not taken for a rollback.

    Raises:
        RegistryError: the trusted-state file is damaged or stays locked (see TrustedState).
    """
    newest: dict[str, int] = {}
    for entry in sorted(entries, key=lambda e: e.version or 0, reverse=True):
        if entry.version is None or entry.model_id in newest:
            continue
        try:
            verify_entry(entry, verify_key, f"{entry.model_id}@{entry.short_id}")
        except SignatureError:
            continue  # the resolver gives it that reason
        newest[entry.model_id] = entry.version
    seen = trusted.seen(registry)
    trusted.raise_to(registry, newest)
    return VersionCheck(newest, seen, trusted.path(registry))


def expiry_reason(entry: IndexEntry, now: datetime | None = None) -> str | None:
    """Why ``entry`` is refused as expired at ``now`` (default: this host's clock), or None."""
    if entry.expires is None or (now or datetime.now(UTC)) < datetime.fromisoformat(entry.expires):
        return None
    return (
        f"{entry.model_id}@{entry.short_id} expired at {entry.expires}: the registry is frozen "
        "or stale (a newer release may be withheld), or its publisher stopped re-signing it. "
        "Re-sign the engine to serve (`llmc registry push REF --sign-key KEY --expires-in DAYS`)"
    )


def highest_versions(
    entries: Iterable[IndexEntry], start: dict[str, int] | None = None
) -> dict[str, int]:
    """Model id -> the highest version among ``entries`` and ``start`` (unversioned entries
    count for none)."""
    highest = dict(start or {})
    for entry in entries:
        if entry.version is not None:
            highest[entry.model_id] = max(highest.get(entry.model_id, 0), entry.version)
    return highest


def describe_release(entry: IndexEntry) -> str:
    """One line on an entry's release, e.g. ``version 5 of gemma-3-270m, expires ...``."""
    if entry.version is None:
        return (
            "unversioned (released before registries numbered releases): this host cannot "
            "tell a rollback to it; re-sign it (`llmc registry push REF --sign-key KEY`) to "
            "give it a version"
        )
    expires = f", expires {entry.expires}" if entry.expires else ""
    signed = "" if entry.signature else ", unsigned"
    return f"version {entry.version} of {entry.model_id}{expires}{signed}"
