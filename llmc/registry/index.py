"""The registry index: which engines exist, keyed by what they were built from and for.

One JSON file, ``<root>/index.json``, holds every entry. Readers read it without a lock (it is
only ever replaced whole, atomically). Writers read-modify-write it under an exclusive file lock
(``<root>/index.lock``, the ``filelock`` package: fcntl.flock on POSIX), so two builds publishing
at once both land and neither is lost. Beside the entries it keeps the highest release version
it ever gave each model (``versions``), raised on every write and never lowered, so a version
removed with its entry is never given again (see rollback.py)::

    {"format": 1, "entries": [...], "versions": {"gemma-3-270m": 5}}
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmc.errors import RegistryError
from llmc.registry.entry import MAX_VERSION, IndexEntry, entry_from_manifest
from llmc.registry.integrity import write_stream_atomic
from llmc.registry.paths import confined
from llmc.registry.rollback import highest_versions

__all__ = ["INDEX_FORMAT", "Index", "IndexEntry", "entry_from_manifest"]

INDEX_NAME = "index.json"
LOCK_NAME = "index.lock"
INDEX_FORMAT = 1
LOCK_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Index:
    """The index file of the registry rooted at ``root``."""

    root: Path

    @property
    def path(self) -> Path:
        return self.root / INDEX_NAME

    def entries(self) -> list[IndexEntry]:
        """Every entry, oldest first. An absent index is an empty registry.

        Raises:
            RegistryError: the index is not valid JSON of this format, or an entry is invalid
                (see ``IndexEntry``): nothing is read from an index holding a crafted entry.
        """
        return self._read()[0]

    def versions(self) -> dict[str, int]:
        """Model id -> the highest release version this registry gave it: the highest of its
        entries' and of the removed entries' (kept in the index).

        Raises:
            RegistryError: as ``entries``, or a version is not a release number.
        """
        return self._read()[1]

    def _read(self) -> tuple[list[IndexEntry], dict[str, int]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return [], {}
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise RegistryError(
                f"{self.path} is not valid JSON ({error}); restore it or remove it and "
                "re-publish the engines"
            ) from error
        if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
            raise RegistryError(
                f"{self.path} is not an llmc registry index of format {INDEX_FORMAT}; "
                "use a registry written by this llmc version"
            )
        listed = data.get("entries", [])
        if not isinstance(listed, list):
            raise RegistryError(f"{self.path}: 'entries' is not a list; restore the index")
        try:
            entries = [
                IndexEntry.from_dict(e, f"{self.path} entry {i}") for i, e in enumerate(listed)
            ]
        except RegistryError as error:
            raise RegistryError(f"{error}; delete that entry from {self.path} first") from error
        versions = data.get("versions", {})
        if not isinstance(versions, dict) or any(
            type(v) is not int or not 1 <= v <= MAX_VERSION for v in versions.values()
        ):
            raise RegistryError(
                f"{self.path}: 'versions' is not a map of model ids to release numbers; restore "
                "the index, or delete that key (each model's versions then continue from its "
                "entries' highest)"
            )
        return entries, highest_versions(entries, versions)

    def update(self, change: Callable[[list[IndexEntry]], list[IndexEntry]]) -> list[IndexEntry]:
        """Replace the entries with ``change(entries)`` under the index lock; returns the result.

        Raises:
            RegistryError: the lock could not be taken in LOCK_TIMEOUT_S seconds.
        """
        from filelock import Timeout

        try:
            with self.lock():
                entries, versions = self._read()
                entries = change(entries)
                self._write(entries, versions)
        except Timeout as error:
            raise RegistryError(
                f"{self.root / LOCK_NAME} stayed locked for {LOCK_TIMEOUT_S:g} s; another llmc "
                "process is writing the registry, retry when it is done"
            ) from error
        return entries

    def _write(self, entries: list[IndexEntry], versions: dict[str, int]) -> None:
        data = {
            "format": INDEX_FORMAT,
            "entries": [e.to_dict() for e in entries],
            "versions": highest_versions(entries, versions),
        }
        text = (json.dumps(data, indent=1) + "\n").encode()
        write_stream_atomic([text], self.path, mode=0o644)

    def lock(self):
        """The index lock, for operations that must not interleave with an update (gc).

        Raises:
            RegistryError: ``index.lock`` is a symlink out of the root (taking the lock
                truncates the file).
        """
        from filelock import FileLock

        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(confined(self.root / LOCK_NAME, self.root), timeout=LOCK_TIMEOUT_S)
