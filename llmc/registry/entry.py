"""One registry entry: an engine's key fields, its blobs, and what its signature covers.

Entries are read from files anyone with write access to a registry may craft (``index.json``, an
S3 ``entries/`` object), and their fields reach file paths, sorting and filters. So every field
is validated when an entry is constructed, before any use: names are 1-128 characters of
``[A-Za-z0-9._-]`` and not ``.`` or ``..``, digests are sha256 hex, file paths are relative
POSIX paths of such names. A signature covers every field but ``size_bytes`` (recomputed from
the stored blobs) in one canonical serialization (``signed_payload``): the fields copied from the
manifest, and the two the registry gives a release (``version``, ``expires``; see rollback.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime

from llmc.engine.files import DRAFT_DIR, MANIFEST_NAME
from llmc.engine.lora import ADAPTERS_DIR
from llmc.engine.manifest import parse_manifest
from llmc.errors import EngineCorruptError, RegistryError
from llmc.registry.integrity import is_digest

MAX_NAME = 128
MAX_FILES = 10_000
MAX_DEPTH = 8
#: Signatures are over this tag and the canonical JSON of the signed fields. Signatures made by
#: llmc before it (over the manifest's bytes alone) do not verify: re-sign those engines.
SIGNATURE_SCHEME = b"llmc-registry-entry-v2\n"
_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_NAME}}}")
_VERSION = re.compile(rf"[A-Za-z0-9._+-]{{1,{MAX_NAME}}}")  # PEP 440 local versions: 1.0+cu12
_BASE64 = re.compile(r"[A-Za-z0-9+/=]{1,256}")
_NAMES = ("model_id", "target", "arch", "dtype", "quant", "kv_cache_dtype", "backend")
_NAMES += ("execution_provider",)
_VERSIONS = ("llmc_version", "backend_version", "execution_provider_version")
_DIGESTS = ("checkpoint_digest", "build_config_hash", "manifest_digest")
_UNSIGNED = ("signature", "size_bytes")
#: Fields a registry gives a release, not copied from the manifest; signed when present.
_RELEASE = ("version", "expires")
#: Versions stay exact in every JSON reader (IEEE doubles hold integers up to 2**53).
MAX_VERSION = 2**53 - 1
#: Where a draft engine's files sit in an engine directory and in ``draft_files``.
DRAFT_PREFIX = f"{DRAFT_DIR}/"
DRAFT_MANIFEST = f"{DRAFT_DIR}/{MANIFEST_NAME}"
#: Where the adapters stored with a LoRA engine sit in its directory and in ``lora_files``.
ADAPTERS_PREFIX = f"{ADAPTERS_DIR}/"


@dataclass(frozen=True, kw_only=True)
class IndexEntry:
    """One engine in a registry: its key fields, copied from its manifest, and its blobs.

    Digests are sha256 hex. ``manifest_digest`` names the ``manifest.json`` blob and identifies
    the entry; ``files`` maps each engine file (POSIX path in the engine directory) to its blob,
    exactly as the manifest lists them. ``draft_files`` does the same for the draft engine built
    beside it (``llmc build --draft``), under ``draft/``, its ``draft/manifest.json`` included
    (the manifest records that one's digest, ``check_entry_agrees`` checks the link, the loader
    checks the draft's files against it). ``lora_files`` does the same for the LoRA adapters
    stored with the engine (``llmc lora add``), under ``lora/<name>/``. ``version`` is the
    release's number among its
    model's releases in the registry (1, 2, ...; None: released before registries numbered
    them), ``expires`` the time after which a verifying host refuses it (ISO 8601 with its UTC
    offset; None: never); see rollback.py. ``signature`` is an Ed25519 signature (base64) of
    ``signed_payload()``, or None for an unsigned engine. ``size_bytes`` is the bytes of every
    blob.

    Raises:
        RegistryError: a field is of the wrong type or holds a value outside its character set
            (see the module docstring); the message names the field.
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
    draft_files: dict[str, str] = field(default_factory=dict)
    lora_files: dict[str, str] = field(default_factory=dict)
    size_bytes: int = 0
    created_at: str
    version: int | None = None
    expires: str | None = None
    signature: str | None = None

    def __post_init__(self) -> None:
        for name in _NAMES:
            _check(name, getattr(self, name), _NAME)
        for name in _VERSIONS:
            value = getattr(self, name)
            if value is not None or name != "execution_provider_version":
                _check(name, value, _VERSION)
        for name in _DIGESTS:
            value = getattr(self, name)
            if not isinstance(value, str) or not is_digest(value):
                _refuse(name, value, "a sha256 digest (64 lowercase hex digits)")
        if not isinstance(self.isa, list):
            _refuse("isa", self.isa, "a list of ISA feature names")
        for feature in self.isa:
            _check("isa", feature, _NAME)
        _check_files(self.files)
        _check_files(self.draft_files, "draft_files")
        if any(not p.startswith(DRAFT_PREFIX) for p in self.draft_files):
            _refuse("draft_files", list(self.draft_files), f"paths under {DRAFT_PREFIX}")
        _check_files(self.lora_files, "lora_files")
        if any(not p.startswith(ADAPTERS_PREFIX) for p in self.lora_files):
            _refuse("lora_files", list(self.lora_files), f"paths under {ADAPTERS_PREFIX}")
        if type(self.size_bytes) is not int or self.size_bytes < 0:
            _refuse("size_bytes", self.size_bytes, "a byte count (an integer >= 0)")
        _check_time("created_at", self.created_at)
        if self.version is not None and (
            type(self.version) is not int or not 1 <= self.version <= MAX_VERSION
        ):
            _refuse("version", self.version, f"a release number from 1 to {MAX_VERSION}")
        if self.expires is not None:
            _check_time("expires", self.expires)
        if self.signature is not None:
            _check("signature", self.signature, _BASE64)

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
    def created(self) -> datetime:
        """``created_at`` as an aware datetime: the order of "newest" (the strings do not order
        as times across UTC offsets)."""
        return datetime.fromisoformat(self.created_at)

    @property
    def short_id(self) -> str:
        """The first 12 hex digits of the manifest digest, as ``docker images`` shows ids."""
        return self.manifest_digest[:12]

    @property
    def blobs(self) -> list[str]:
        """Every blob the entry needs: its manifest first, then its files', its draft's and
        its adapters'."""
        return [self.manifest_digest, *dict.fromkeys(self.stored_files.values())]

    @property
    def stored_files(self) -> dict[str, str]:
        """Every file of the engine directory but its manifest: its own, its draft's and its
        adapters', by path."""
        return {**self.files, **self.draft_files, **self.lora_files}

    def matches(self, ref: str) -> bool:
        """Whether ``ref`` names this entry: its model id, a prefix (6+ hex digits) of its
        manifest digest, or ``MODEL@PREFIX``."""
        model, _, prefix = ref.partition("@")
        if prefix:
            return model == self.model_id and _digest_prefix(prefix, self.manifest_digest)
        return ref == self.model_id or _digest_prefix(ref, self.manifest_digest)

    def signed_payload(self) -> bytes:
        """The bytes a signature covers: ``SIGNATURE_SCHEME`` then every field but
        ``signature`` and ``size_bytes`` (and ``draft_files`` when empty, ``version`` and
        ``expires`` when None) as JSON with sorted keys, no whitespace, ASCII only. Every one of
        them is copied from the manifest, is its digest, is the draft's (its digests), or is the
        release's version and expiry, so the same bytes come from the engine directory and those
        two alone."""
        data = {k: v for k, v in self.to_dict().items() if k not in _UNSIGNED}
        # Absent fields are left out so entries without a draft, adapters or a version (signed
        # before they existed) sign as they always did.
        for name in ("draft_files", "lora_files"):
            if not data[name]:
                del data[name]
        for name in _RELEASE:
            if data[name] is None:
                del data[name]
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return SIGNATURE_SCHEME + text.encode("ascii")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str) -> IndexEntry:
        """Raises RegistryError if a field is missing or invalid (a corrupt, foreign or crafted
        entry), naming ``where`` and the field."""
        if not isinstance(data, dict):
            raise RegistryError(f"{where}: a registry entry must be a JSON object; refusing it")
        names = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except TypeError as error:
            raise RegistryError(f"{where}: malformed registry entry ({error})") from error
        except RegistryError as error:
            raise RegistryError(f"{where}: {error}") from error


def entry_from_manifest(
    manifest,
    manifest_digest: str,
    size_bytes: int,
    signature: str | None = None,
    draft_files: dict[str, str] | None = None,
    lora_files: dict[str, str] | None = None,
) -> IndexEntry:
    """The index entry of an engine, from its ``EngineManifest`` and manifest blob digest, with
    its draft engine's ``draft_files`` and its stored adapters' ``lora_files`` (see
    ``IndexEntry``) when it has them.

    Raises:
        RegistryError: a manifest field is not valid in an entry (see ``IndexEntry``).
    """
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
        draft_files=dict(draft_files or {}),
        lora_files=dict(lora_files or {}),
        size_bytes=size_bytes,
        created_at=manifest.created_at,
        signature=signature,
    )


def check_entry_agrees(entry: IndexEntry, manifest_raw: bytes, what: str) -> None:
    """Refuse an entry whose fields differ from its manifest's: an index or a remote entry
    object edited by hand, its signature (which covers the manifest's fields) notwithstanding.

    Raises:
        EngineCorruptError, EngineMismatchError: not a manifest, or a field differs (named).
    """

    manifest = parse_manifest(manifest_raw, what)
    for name in (f.name for f in fields(IndexEntry)):
        if name in ("manifest_digest", "draft_files", "lora_files", *_RELEASE, *_UNSIGNED):
            continue  # not manifest fields; the draft's link is checked below
        ours, theirs = getattr(entry, name), getattr(manifest, name)
        if ours != theirs:
            raise EngineCorruptError(
                f"{what}: the entry's {name} is {ours!r} but its manifest's is {theirs!r}; the "
                "entry was edited. Refusing it: `llmc registry rm` it and re-publish or re-pull"
            )
    # An entry without draft files (published before they were kept) checks out without the
    # draft, which the loader then refuses to speculate with; one with them must name the
    # draft manifest the engine's manifest records.
    if entry.lora_files and not manifest.lora:
        raise EngineCorruptError(
            f"{what}: the entry lists LoRA adapters but its engine has no LoRA slots; the entry "
            "was edited. Refusing it: `llmc registry rm` it and re-publish or re-pull"
        )
    recorded = (manifest.draft or {}).get("manifest_sha256")
    listed = entry.draft_files.get(DRAFT_MANIFEST)
    if entry.draft_files and listed != recorded:
        raise EngineCorruptError(
            f"{what}: the entry's draft manifest is {listed!r} but its manifest records "
            f"{recorded!r}; the entry was edited. Refusing it: `llmc registry rm` it and "
            "re-publish or re-pull"
        )


def _check(name: str, value: object, pattern: re.Pattern) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value) or value in (".", ".."):
        chars = pattern.pattern.split("{")[0]
        _refuse(name, value, f"1-{MAX_NAME} characters of {chars}, not '.' or '..'")


def _check_files(files: object, name: str = "files") -> None:
    if not isinstance(files, dict) or len(files) > MAX_FILES:
        _refuse(name, type(files).__name__, f"a mapping of at most {MAX_FILES} paths")
    for path, digest in files.items():
        parts = path.split("/") if isinstance(path, str) else [None]
        if len(parts) > MAX_DEPTH or any(not _is_name(p) for p in parts):
            _refuse(
                name,
                path,
                f"a relative POSIX path of at most {MAX_DEPTH} names, each 1-{MAX_NAME} "
                "characters of [A-Za-z0-9._-], not '.' or '..'",
            )
        if not isinstance(digest, str) or not is_digest(digest):
            _refuse(f"{name}[{path!r}]", digest, "a sha256 digest (64 lowercase hex digits)")


def _is_name(part: object) -> bool:
    return isinstance(part, str) and bool(_NAME.fullmatch(part)) and part not in (".", "..")


def _check_time(name: str, value: object) -> None:
    try:
        parsed = (
            datetime.fromisoformat(value) if isinstance(value, str) and len(value) < 40 else None
        )
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        _refuse(name, value, "an ISO 8601 time with its UTC offset")


def _refuse(name: str, value: object, expected: str) -> None:
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    raise RegistryError(
        f"registry entry field {name!r} is {shown}, expected {expected}; the entry was crafted "
        "or damaged, refusing it (re-publish or re-push the engine from its build)"
    )


def _digest_prefix(prefix: str, digest: str) -> bool:
    prefix = prefix.removeprefix("sha256:")
    return len(prefix) >= 6 and digest.startswith(prefix)
