"""The local registry: content-addressed blobs plus an index, rooted at ``engines/`` by default.

Layout under the root::

    blobs/sha256/ab/abcd...      every engine file and manifest, named by its sha256 (0444)
    index.json, index.lock       the entries (see index.py) and the lock writers take
    checkouts/<name>-<id>/       engine directories assembled from blobs (hard links) to load

Publishing copies each engine file into the store, checking it against the digest its manifest
lists, then adds the index entry last: an entry never names a blob that was not fully written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from llmc.errors import BlobCorruptError, EngineCorruptError, RegistryError
from llmc.registry.blobs import BlobStore
from llmc.registry.index import Index, IndexEntry, entry_from_manifest
from llmc.registry.integrity import check_digest, write_stream_atomic

DEFAULT_ROOT = "engines"
CHECKOUTS = "checkouts"
#: Blobs, temporary files and checkouts younger than this survive ``gc`` (a publish in flight
#: writes its blobs before its index entry).
DEFAULT_GC_GRACE_S = 3600.0


@dataclass(frozen=True)
class GcReport:
    """What ``gc`` removed: unreferenced blobs and the bytes they held, stale checkouts and
    temporary files."""

    blobs_removed: int
    bytes_freed: int
    checkouts_removed: int
    partials_removed: int


@dataclass(frozen=True)
class VerifyProblem:
    """One damaged entry found by ``verify``: which entry and what is wrong."""

    entry: IndexEntry
    message: str


@dataclass(frozen=True)
class LocalRegistry:
    """A registry on the local file system, rooted at ``root``."""

    root: Path = field(default_factory=lambda: Path(DEFAULT_ROOT))

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def blobs(self) -> BlobStore:
        return BlobStore(self.root)

    @property
    def index(self) -> Index:
        return Index(self.root)

    def entries(self) -> list[IndexEntry]:
        return self.index.entries()

    def find(self, ref: str) -> list[IndexEntry]:
        """Entries ``ref`` names (model id, digest prefix or MODEL@PREFIX), newest first."""
        found = [e for e in self.entries() if e.matches(ref)]
        return sorted(found, key=lambda e: e.created_at, reverse=True)

    def get(self, ref: str) -> IndexEntry:
        """The one entry ``ref`` names. Raises RegistryError for none or several."""
        found = self.find(ref)
        if not found:
            raise RegistryError(
                f"no engine {ref!r} in the registry {self.root}; `llmc registry ls` lists them"
            )
        if len(found) > 1:
            ids = ", ".join(f"{e.model_id}@{e.short_id}" for e in found)
            raise RegistryError(f"{ref!r} names {len(found)} engines ({ids}); give one id")
        return found[0]

    def publish(self, engine_dir: str | Path, signature: str | None = None) -> IndexEntry:
        """Store a built engine directory's files and manifest as blobs and index it.

        Only the files the manifest lists are stored, each checked against its digest while it
        is copied. An entry with the same key (see ``IndexEntry.key``) is replaced.

        Raises:
            EngineNotFoundError, EngineCorruptError, EngineMismatchError: no valid manifest.
            BlobCorruptError: a file differs from its manifest digest (nothing is indexed).
        """
        from llmc.compiler.manifest import MANIFEST_NAME, parse_manifest, read_manifest

        engine_dir = Path(engine_dir)
        read_manifest(engine_dir)  # raises the not-found / not-an-engine errors
        raw = (engine_dir / MANIFEST_NAME).read_bytes()
        manifest = parse_manifest(raw, str(engine_dir / MANIFEST_NAME))
        size = len(raw)
        for relative, digest in manifest.files.items():
            source = engine_dir / _safe_relative(relative, engine_dir)
            self.blobs.put_file(source, digest)
            size += source.stat().st_size
        manifest_digest = self._put_manifest(raw)
        return self.add(entry_from_manifest(manifest, manifest_digest, size, signature))

    def add(self, entry: IndexEntry) -> IndexEntry:
        """Index ``entry`` (its blobs must be stored), replacing any entry of the same key."""
        missing = [d for d in entry.blobs if not self.blobs.has(d)]
        if missing:
            raise RegistryError(f"cannot index {entry.model_id}: blobs {missing} are not stored")
        self.index.update(lambda es: [e for e in es if e.key != entry.key] + [entry])
        return entry

    def manifest_bytes(self, entry: IndexEntry) -> bytes:
        """The entry's ``manifest.json``, checked against its digest.

        Raises:
            BlobCorruptError: the manifest blob is missing or altered.
        """
        import hashlib

        path = self.blobs.path(entry.manifest_digest)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            self.blobs.verify(entry.manifest_digest)  # raises "missing"
            raise
        what = f"manifest of {entry.model_id}@{entry.short_id}"
        check_digest(entry.manifest_digest, hashlib.sha256(raw).hexdigest(), what)
        return raw

    def manifest(self, entry: IndexEntry):
        """The entry's parsed, digest-checked ``EngineManifest``."""
        from llmc.compiler.manifest import parse_manifest

        what = f"manifest of {entry.model_id}@{entry.short_id}"
        manifest = parse_manifest(self.manifest_bytes(entry), what)
        if manifest.files != entry.files:
            raise EngineCorruptError(
                f"{what}: the index lists other files than the manifest; the index was edited "
                "by hand. `llmc registry rm` the entry and re-publish it"
            )
        return manifest

    def checkout(self, entry: IndexEntry) -> Path:
        """An engine directory for ``entry`` under ``checkouts/``, assembled once from its
        blobs by hard links (copies across file systems), renamed into place when complete.

        Digests are not re-checked here: the loader checks every file against the manifest.

        Raises:
            BlobCorruptError: a blob of the entry is missing.
        """
        from llmc.compiler.manifest import MANIFEST_NAME

        final = self.root / CHECKOUTS / checkout_name(entry)
        if (final / MANIFEST_NAME).is_file():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            links = {**entry.files, MANIFEST_NAME: entry.manifest_digest}
            for relative, digest in links.items():
                target = staging / _safe_relative(relative, staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                source = self.blobs.path(digest)
                if not source.is_file():
                    self.blobs.verify(digest)  # raises "missing"
                _link_or_copy(source, target)
            try:
                os.rename(staging, final)
            except OSError:  # another process checked it out first
                if not (final / MANIFEST_NAME).is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return final

    def remove(self, ref: str) -> list[IndexEntry]:
        """Drop every entry ``ref`` names from the index, and their checkouts; blobs stay until
        ``gc``. Raises RegistryError if ``ref`` names none."""
        removed: list[IndexEntry] = []

        def change(entries: list[IndexEntry]) -> list[IndexEntry]:
            removed.extend(e for e in entries if e.matches(ref))
            return [e for e in entries if not e.matches(ref)]

        self.index.update(change)
        if not removed:
            raise RegistryError(f"no engine {ref!r} in the registry {self.root}")
        for entry in removed:
            shutil.rmtree(self.root / CHECKOUTS / checkout_name(entry), ignore_errors=True)
        return removed

    def verify(self, ref: str | None = None) -> list[VerifyProblem]:
        """Re-hash every blob of every entry (or of those ``ref`` names); returns the problems."""
        entries = self.find(ref) if ref else self.entries()
        if ref and not entries:
            raise RegistryError(f"no engine {ref!r} in the registry {self.root}")
        problems = []
        for entry in entries:
            for digest in entry.blobs:
                try:
                    self.blobs.verify(digest)
                except BlobCorruptError as error:
                    problems.append(VerifyProblem(entry, str(error)))
        return problems

    def gc(self, grace_s: float = DEFAULT_GC_GRACE_S) -> GcReport:
        """Delete blobs no entry references and checkouts of removed entries, older than
        ``grace_s`` seconds, under the index lock."""
        cutoff = time.time() - grace_s
        blobs_removed = bytes_freed = checkouts_removed = 0
        with self.index.lock():
            entries = self.entries()
            referenced = {d for e in entries for d in e.blobs}
            for digest in list(self.blobs.digests()):
                path = self.blobs.path(digest)
                if digest not in referenced and path.stat().st_mtime <= cutoff:
                    bytes_freed += self.blobs.remove(digest)
                    blobs_removed += 1
            partials = self.blobs.remove_stale_partials(grace_s)
            wanted = {checkout_name(e) for e in entries}
            checkouts = self.root / CHECKOUTS
            for path in checkouts.iterdir() if checkouts.is_dir() else ():
                if path.name not in wanted and path.stat().st_mtime <= cutoff:
                    shutil.rmtree(path, ignore_errors=True)
                    checkouts_removed += 1
        return GcReport(blobs_removed, bytes_freed, checkouts_removed, partials)

    def _put_manifest(self, raw: bytes) -> str:
        import hashlib

        digest = hashlib.sha256(raw).hexdigest()
        if self.blobs.has(digest):
            os.utime(self.blobs.path(digest))
        else:
            write_stream_atomic([raw], self.blobs.path(digest), mode=0o444)
        return digest


def checkout_name(entry: IndexEntry) -> str:
    """``<model>-<target>-<dtype>-<quant>-<id>``: readable, and unique per manifest."""
    return f"{entry.model_id}-{entry.target}-{entry.dtype}-{entry.quant}-{entry.short_id}"


def _safe_relative(relative: str, root: Path) -> str:
    """Refuse a manifest path that leaves the engine directory."""
    path = PurePosixPath(relative)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise EngineCorruptError(
            f"manifest lists {relative!r}, outside the engine directory {root}; refusing it"
        )
    return relative


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
