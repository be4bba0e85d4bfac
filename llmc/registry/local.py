"""The local registry: content-addressed blobs plus an index, rooted at ``engines/`` by default.

Layout under the root::

    blobs/sha256/ab/abcd...      every engine file and manifest, named by its sha256 (0444)
    index.json, index.lock       the entries (see index.py) and the lock writers take
    checkouts/<manifest sha256>/ engine directories assembled from blobs (hard links) to load

Publishing copies each engine file into the store, checking it against the digest its manifest
lists, then adds the index entry last: an entry never names a blob that was not fully written.
Every path the registry writes or deletes is named by a digest and checked to stay under the
root (``paths.confined``); no entry field but a digest becomes a path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from llmc.engine.files import DRAFT_DIR, verify_engine_files
from llmc.engine.lora import ADAPTERS_DIR
from llmc.engine.manifest import MANIFEST_NAME, parse_manifest, read_manifest
from llmc.errors import BlobCorruptError, EngineCorruptError, EngineError, RegistryError
from llmc.registry.blobs import BlobStore
from llmc.registry.entry import DRAFT_PREFIX, check_entry_agrees
from llmc.registry.index import Index, IndexEntry, entry_from_manifest
from llmc.registry.integrity import check_checkout, check_digest, write_stream_atomic
from llmc.registry.nested_files import adapter_files, draft_files, verify_adapters
from llmc.registry.paths import confined, remove_tree

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

    @property
    def identity(self) -> str:
        """What names this registry in a host's trusted state (trusted_state.py): the root's
        real path."""
        return str(self.root.resolve())

    def entries(self) -> list[IndexEntry]:
        return self.index.entries()

    def find(self, ref: str) -> list[IndexEntry]:
        """Entries ``ref`` names (model id, digest prefix or MODEL@PREFIX), newest first."""
        found = [e for e in self.entries() if e.matches(ref)]
        return sorted(found, key=lambda e: e.created, reverse=True)

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

    def publish(self, engine_dir: str | Path) -> IndexEntry:
        """Store a built engine directory (``store``) and index it, unsigned, as its model's
        next release (``release``); an entry with the same key (``IndexEntry.key``) is replaced.

        Raises:
            see ``store``.
        """
        return self.release(self.store(engine_dir))

    def store(self, engine_dir: str | Path) -> IndexEntry:
        """Store a built engine directory's files and manifest as blobs; returns its entry, not
        yet indexed (``release`` or ``add`` index it; ``gc`` removes blobs no entry names).

        Only the files the manifest lists are stored, each checked against its digest while it
        is copied, and the draft engine's (``llmc build --draft``), checked against the digest
        the manifest records for the draft's manifest and against that manifest, and the LoRA
        adapters stored with it (``llmc lora add``: ``lora/<name>/``, PEFT's two files each).

        Raises:
            EngineNotFoundError, EngineCorruptError, EngineMismatchError: no valid manifest.
            RegistryError: a manifest field is not valid in an entry; nothing is written.
            BlobCorruptError: a file differs from its manifest digest.
        """

        engine_dir = Path(engine_dir)
        read_manifest(engine_dir)  # raises the not-found / not-an-engine errors
        raw = (engine_dir / MANIFEST_NAME).read_bytes()
        manifest = parse_manifest(raw, str(engine_dir / MANIFEST_NAME))
        digest = hashlib.sha256(raw).hexdigest()
        draft = draft_files(engine_dir, manifest)
        lora = adapter_files(engine_dir, manifest)
        entry = entry_from_manifest(manifest, digest, 0, None, draft, lora)  # validates first
        for relative, file_digest in entry.stored_files.items():
            self.blobs.put_file(engine_dir / relative, file_digest)
        self._put_manifest(raw)
        return entry

    def add(self, entry: IndexEntry) -> IndexEntry:
        """Index ``entry`` as it is (its version and signature kept; its blobs must be stored),
        replacing any entry of the same key; returns it with ``size_bytes`` recomputed from the
        stored blobs (never trusted).

        Raises:
            RegistryError: a blob of the entry is not stored.
        """
        entry = self._sized(entry)
        self.index.update(lambda es: [e for e in es if e.key != entry.key] + [entry])
        return entry

    def release(
        self,
        entry: IndexEntry,
        sign: Callable[[IndexEntry], str] | None = None,
        expires: str | None = None,
        above: int | None = None,
    ) -> IndexEntry:
        """Index ``entry`` (its blobs must be stored) as its model's next release: ``version``
        one more than the highest this registry ever gave the model and than ``above`` (the
        highest of a remote it goes to), ``expires`` (ISO 8601 or None), signed by
        ``sign(entry)`` (base64 signature) when given, else unsigned. Numbered and signed under
        the index lock, so two releases here never share a version. Replaces an entry of the
        same key; see rollback.py.

        Raises:
            RegistryError: a blob of the entry is not stored, or ``expires`` is not a time.
            SignatureError: ``sign`` cannot sign (the key is unreadable); nothing is indexed.
        """
        entry = self._sized(entry)
        released: list[IndexEntry] = []

        def change(entries: list[IndexEntry]) -> list[IndexEntry]:
            given = max(self.index.versions().get(entry.model_id, 0), above or 0)
            new = replace(entry, version=given + 1, expires=expires, signature=None)
            if sign is not None:
                new = replace(new, signature=sign(new))
            released.append(new)
            return [e for e in entries if e.key != new.key] + [new]

        self.index.update(change)
        return released[0]

    def _sized(self, entry: IndexEntry) -> IndexEntry:
        missing = [d for d in entry.blobs if not self.blobs.has(d)]
        if missing:
            raise RegistryError(f"cannot index {entry.model_id}: blobs {missing} are not stored")
        size = sum(
            self.blobs.path(d).stat().st_size
            for d in [entry.manifest_digest, *entry.stored_files.values()]
        )
        return replace(entry, size_bytes=size)

    def manifest_bytes(self, entry: IndexEntry) -> bytes:
        """The entry's ``manifest.json``, checked against its digest and against the entry
        (``check_entry_agrees``).

        Raises:
            BlobCorruptError: the manifest blob is missing or altered.
            EngineCorruptError, EngineMismatchError: it is no manifest, or the entry disagrees.
        """
        path = self.blobs.path(entry.manifest_digest)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            self.blobs.verify(entry.manifest_digest)  # raises "missing"
            raise
        what = f"manifest of {entry.model_id}@{entry.short_id}"
        check_digest(entry.manifest_digest, hashlib.sha256(raw).hexdigest(), what)
        check_entry_agrees(entry, raw, what)
        return raw

    def manifest(self, entry: IndexEntry):
        """The entry's parsed ``EngineManifest``, checked as ``manifest_bytes`` checks it."""

        what = f"manifest of {entry.model_id}@{entry.short_id}"
        return parse_manifest(self.manifest_bytes(entry), what)

    def checkout(self, entry: IndexEntry) -> Path:
        """An engine directory for ``entry`` under ``checkouts/``, assembled once from its
        blobs by hard links (copies across file systems), renamed into place when complete.

        Digests are not re-checked here: the loader checks every file against the manifest.
        The stored LoRA adapters, which no manifest lists, are re-hashed against the entry at
        every checkout (EngineCorruptError for one edited in the checkout).

        Raises:
            BlobCorruptError: a blob of the entry is missing.
            RegistryError: ``checkouts/`` resolves outside the root (a symlink).
        """

        final = confined(self.root / CHECKOUTS / checkout_name(entry), self.root)
        if (final / MANIFEST_NAME).is_file():
            verify_adapters(entry, final)
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            links = {**entry.stored_files, MANIFEST_NAME: entry.manifest_digest}
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
        ``gc``.

        Raises:
            RegistryError: ``ref`` names none, or a checkout resolves outside the root (a
                symlink; it is left alone, the entry is still dropped).
        """
        removed: list[IndexEntry] = []

        def change(entries: list[IndexEntry]) -> list[IndexEntry]:
            removed.extend(e for e in entries if e.matches(ref))
            return [e for e in entries if not e.matches(ref)]

        self.index.update(change)
        if not removed:
            raise RegistryError(f"no engine {ref!r} in the registry {self.root}")
        for entry in removed:
            remove_tree(self.root / CHECKOUTS / checkout_name(entry), self.root)
        return removed

    def verify(self, ref: str | None = None) -> list[VerifyProblem]:
        """Re-hash every blob of every entry (or of those ``ref`` names), check each entry
        against its manifest, and check each entry's checkout if there is one (its
        ``manifest.json`` is the entry's, its files exactly the listed ones, each re-hashed: a
        checkout is reused once assembled, so a file edited there later is found here, not at
        load); returns the problems. A checkout is checked only when its entry's blobs are
        sound: its files are hard links to them, so one damaged blob is one problem.

        Raises:
            RegistryError: ``ref`` names no entry.
        """
        entries = self.find(ref) if ref else self.entries()
        if ref and not entries:
            raise RegistryError(f"no engine {ref!r} in the registry {self.root}")
        problems = []
        for entry in entries:
            found = []
            for digest in entry.blobs:
                try:
                    self.blobs.verify(digest)
                except BlobCorruptError as error:
                    found.append(VerifyProblem(entry, str(error)))
            try:
                if not found:  # a damaged manifest blob is reported once, above
                    self.manifest_bytes(entry)
            except EngineError as error:
                found.append(VerifyProblem(entry, str(error)))
            problems += found or self._verify_checkout(entry)
        return problems

    def _verify_checkout(self, entry: IndexEntry) -> list[VerifyProblem]:
        """The problem with ``entry``'s checkout, if it exists and differs from the entry."""
        checkout = self.root / CHECKOUTS / checkout_name(entry)
        if not checkout.exists() and not checkout.is_symlink():
            return []
        todo = (
            f"delete {checkout}: it is assembled again from the registry's blobs when the engine "
            "is next served"
        )
        try:
            confined(checkout, self.root)
            check_checkout(checkout, entry.manifest_digest, f"{entry.model_id}@{entry.short_id}")
            nested = ((DRAFT_DIR,) if entry.draft_files else ()) + (
                (ADAPTERS_DIR,) if entry.lora_files else ()
            )
            verify_engine_files(entry.files, checkout, todo, nested=nested)
            verify_adapters(entry, checkout)
            if entry.draft_files:
                draft = {p.removeprefix(DRAFT_PREFIX): d for p, d in entry.draft_files.items()}
                check_checkout(
                    checkout / DRAFT_DIR, draft.pop(MANIFEST_NAME), f"the draft of {entry.model_id}"
                )
                verify_engine_files(draft, checkout / DRAFT_DIR, todo)
        except (EngineError, RegistryError) as error:
            return [VerifyProblem(entry, str(error))]
        return []

    def gc(self, grace_s: float = DEFAULT_GC_GRACE_S) -> GcReport:
        """Delete blobs no entry references and checkouts of removed entries, older than
        ``grace_s`` seconds, under the index lock.

        Raises:
            RegistryError: a blob, checkout or temporary file resolves outside the root (a
                symlink); nothing outside is deleted.
        """
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
            for path in confined(checkouts, self.root).iterdir() if checkouts.is_dir() else ():
                if path.name not in wanted and path.lstat().st_mtime <= cutoff:
                    checkouts_removed += remove_tree(path, self.root)
        return GcReport(blobs_removed, bytes_freed, checkouts_removed, partials)

    def _put_manifest(self, raw: bytes) -> str:
        digest = hashlib.sha256(raw).hexdigest()
        path = self.blobs.writable_path(digest)
        if path.is_file():
            os.utime(path)
        else:
            write_stream_atomic([raw], path, mode=0o444)
        return digest


def checkout_name(entry: IndexEntry) -> str:
    """The manifest's full sha256: unique per engine, and no entry field but a digest becomes
    a path (``llmc registry resolve`` prints the directory)."""
    return entry.manifest_digest


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
