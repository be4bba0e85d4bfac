"""The registry index: which engines exist, keyed by what they were built from and for.

One JSON file, ``<root>/index.json``, holds every entry. Readers read it without a lock (it is
only ever replaced whole, atomically). Writers read-modify-write it under an exclusive file lock
(``<root>/index.lock``, the ``filelock`` package: fcntl.flock on POSIX), so two builds publishing
at once both land and neither is lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from llmc.errors import RegistryError
from llmc.registry.integrity import write_stream_atomic

INDEX_NAME = "index.json"
LOCK_NAME = "index.lock"
INDEX_FORMAT = 1
LOCK_TIMEOUT_S = 600.0


@dataclass(frozen=True, kw_only=True)
class IndexEntry:
    """One engine in a registry: its key fields, copied from its manifest, and its blobs.

    Digests are sha256 hex. ``manifest_digest`` names the ``manifest.json`` blob and identifies
    the entry; ``files`` maps each engine file (POSIX path in the engine directory) to its blob,
    exactly as the manifest lists them. ``signature`` is an Ed25519 signature of the manifest's
    bytes (base64), or None for an unsigned engine.
    """

    model_id: str
    checkpoint_digest: str
    target: str
    arch: str
    isa: list[str]
    dtype: str
    quant: str
    kv_cache_dtype: str
    llmc_version: str
    backend: str
    backend_version: str
    execution_provider: str
    execution_provider_version: str | None
    build_config_hash: str
    manifest_digest: str
    files: dict[str, str] = field(default_factory=dict)
    size_bytes: int = 0
    created_at: str = ""
    signature: str | None = None

    @property
    def key(self) -> tuple:
        """What makes two entries the same engine: (model + source digest, target, ISA, dtype,
        quant, KV dtype, llmc and backend versions, build options). Publishing an entry whose
        key exists replaces the older one."""
        return (
            self.model_id,
            self.checkpoint_digest,
            self.target,
            self.arch,
            tuple(self.isa),
            self.dtype,
            self.quant,
            self.kv_cache_dtype,
            self.llmc_version,
            self.backend,
            self.backend_version,
            self.execution_provider,
            self.execution_provider_version,
            self.build_config_hash,
        )

    @property
    def short_id(self) -> str:
        """The first 12 hex digits of the manifest digest, as ``docker images`` shows ids."""
        return self.manifest_digest[:12]

    @property
    def blobs(self) -> list[str]:
        """Every blob the entry needs: its manifest first, then its files'."""
        return [self.manifest_digest, *dict.fromkeys(self.files.values())]

    def matches(self, ref: str) -> bool:
        """Whether ``ref`` names this entry: its model id, a prefix (6+ hex digits) of its
        manifest digest, or ``MODEL@PREFIX``."""
        model, _, prefix = ref.partition("@")
        if prefix:
            return model == self.model_id and _digest_prefix(prefix, self.manifest_digest)
        return ref == self.model_id or _digest_prefix(ref, self.manifest_digest)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str) -> IndexEntry:
        """Raises RegistryError if a field is missing (a corrupt or foreign index)."""
        names = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except TypeError as error:
            raise RegistryError(f"{where}: malformed registry entry ({error})") from error


def _digest_prefix(prefix: str, digest: str) -> bool:
    prefix = prefix.removeprefix("sha256:")
    return len(prefix) >= 6 and digest.startswith(prefix)


def entry_from_manifest(
    manifest, manifest_digest: str, size_bytes: int, signature: str | None = None
) -> IndexEntry:
    """The index entry of an engine, from its ``EngineManifest`` and manifest blob digest."""
    return IndexEntry(
        model_id=manifest.model_id,
        checkpoint_digest=manifest.checkpoint_digest,
        target=manifest.target,
        arch=manifest.arch,
        isa=list(manifest.isa),
        dtype=manifest.dtype,
        quant=manifest.quant,
        kv_cache_dtype=manifest.kv_cache_dtype,
        llmc_version=manifest.llmc_version,
        backend=manifest.backend,
        backend_version=manifest.backend_version,
        execution_provider=manifest.execution_provider,
        execution_provider_version=manifest.execution_provider_version,
        build_config_hash=manifest.build_config_hash,
        manifest_digest=manifest_digest,
        files=dict(manifest.files),
        size_bytes=size_bytes,
        created_at=manifest.created_at,
        signature=signature,
    )


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
            RegistryError: the index is not valid JSON of this format.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
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
        return [IndexEntry.from_dict(e, str(self.path)) for e in data.get("entries", [])]

    def update(self, change: Callable[[list[IndexEntry]], list[IndexEntry]]) -> list[IndexEntry]:
        """Replace the entries with ``change(entries)`` under the index lock; returns the result.

        Raises:
            RegistryError: the lock could not be taken in LOCK_TIMEOUT_S seconds.
        """
        from filelock import Timeout

        try:
            with self.lock():
                entries = change(self.entries())
                self._write(entries)
        except Timeout as error:
            raise RegistryError(
                f"{self.root / LOCK_NAME} stayed locked for {LOCK_TIMEOUT_S:g} s; another llmc "
                "process is writing the registry, retry when it is done"
            ) from error
        return entries

    def _write(self, entries: list[IndexEntry]) -> None:
        data = {"format": INDEX_FORMAT, "entries": [e.to_dict() for e in entries]}
        text = (json.dumps(data, indent=1) + "\n").encode()
        write_stream_atomic([text], self.path, mode=0o644)

    def lock(self):
        """The index lock, for operations that must not interleave with an update (gc)."""
        from filelock import FileLock

        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(self.root / LOCK_NAME, timeout=LOCK_TIMEOUT_S)
