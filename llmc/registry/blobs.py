"""Content-addressed blob store: ``<root>/blobs/sha256/<d[:2]>/<d>``, one file per sha256.

The layout of OCI image stores and git objects: a blob's name is the digest of its bytes, so two
engines sharing a tokenizer store it once, a blob never changes once written, and concurrent
writers of the same blob write identical bytes (the last rename wins, harmlessly). Blobs are made
read-only (0444) so a stray write into a checkout fails instead of corrupting the store.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llmc.errors import BlobCorruptError, RegistryError
from llmc.registry.integrity import (
    PARTIAL_SUFFIX,
    check_digest,
    is_digest,
    sha256_file,
    write_stream_atomic,
)
from llmc.registry.paths import confined

_READ_ONLY = 0o444


@dataclass(frozen=True)
class BlobStore:
    """The blobs under one registry root (``root`` is the registry root, not the blob dir)."""

    root: Path

    @property
    def directory(self) -> Path:
        return self.root / "blobs" / "sha256"

    def path(self, digest: str) -> Path:
        """Where the blob ``digest`` (sha256 hex) lives, present or not.

        Raises:
            RegistryError: ``digest`` is not 64 lowercase hex digits (it would name another path).
        """
        if not isinstance(digest, str) or not is_digest(digest):
            raise RegistryError(f"{digest!r} is not a sha256 digest; refusing it as a blob name")
        return self.directory / digest[:2] / digest

    def writable_path(self, digest: str) -> Path:
        """``path(digest)``, checked to be under the registry root (RegistryError if a symlinked
        directory leads out of it)."""
        return confined(self.path(digest), self.root)

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def put_file(self, source: Path, digest: str) -> None:
        """Store a copy of ``source``, which must hash to ``digest``.

        A blob already present is kept (and its mtime refreshed, so ``gc``'s grace period
        protects it until the caller's index entry lands).

        Raises:
            BlobCorruptError: ``source`` does not hash to ``digest``; nothing is stored.
        """
        target = self.writable_path(digest)
        if target.is_file():
            os.utime(target)
            return
        with open(source, "rb") as f:
            write_stream_atomic(f, target, expected=digest, what=str(source), mode=_READ_ONLY)

    def adopt(self, staged: Path, digest: str) -> None:
        """Move an already-verified file (same file system) into the store as ``digest``."""
        target = self.writable_path(digest)
        if target.is_file():
            os.utime(target)
            staged.unlink()
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(staged, _READ_ONLY)
        os.replace(staged, target)

    def verify(self, digest: str) -> None:
        """Re-hash one blob.

        Raises:
            BlobCorruptError: the blob is missing, or its bytes do not hash to ``digest``.
        """
        path = self.path(digest)
        if not path.is_file():
            raise BlobCorruptError(
                f"blob sha256:{digest} is missing from {self.directory}; re-pull or re-publish "
                "the engine that needs it"
            )
        check_digest(digest, sha256_file(path), str(path))

    def digests(self) -> Iterator[str]:
        """Every stored blob's digest (temporary files and foreign names excluded)."""
        if not self.directory.is_dir():
            return
        for path in self.directory.glob("??/*"):
            if is_digest(path.name) and path.parent.name == path.name[:2]:
                yield path.name

    def remove(self, digest: str) -> int:
        """Delete a blob; returns the bytes freed (0 if it was absent).

        Raises:
            RegistryError: the blob's path resolves outside the registry root (a symlink).
        """
        path = confined(self.path(digest), self.root)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        return size

    def remove_stale_partials(self, older_than_s: float) -> int:
        """Delete temporary files left by interrupted writes, older than ``older_than_s``.

        Raises:
            RegistryError: one resolves outside the registry root (a symlink).
        """
        removed = 0
        cutoff = time.time() - older_than_s
        if not self.directory.is_dir():
            return 0
        for path in self.directory.glob(f"??/.*{PARTIAL_SUFFIX}"):
            if confined(path, self.root).stat().st_mtime <= cutoff:
                path.unlink(missing_ok=True)
                removed += 1
        return removed
