"""The files a registry stores beside an engine's own (which its manifest lists): the draft
engine's (``llmc build --draft``, under ``draft/``, checked against the digest the engine's
manifest records) and the LoRA adapters stored with it (``llmc lora add``, under ``lora/``,
whose digests only the signed entry holds)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from llmc.engine.files import DRAFT_DIR, sha256_file
from llmc.engine.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, ADAPTERS_DIR, stored_adapters
from llmc.engine.manifest import MANIFEST_NAME, parse_manifest
from llmc.errors import EngineCorruptError
from llmc.registry.entry import DRAFT_PREFIX
from llmc.registry.index import IndexEntry


def adapter_files(engine_dir: Path, manifest) -> dict[str, str]:
    """The LoRA adapters stored with an engine (``IndexEntry.lora_files``): PEFT's two files of
    each ``lora/<name>/``, by path, hashed; {} without any. Whether an adapter fits the engine
    was checked when it was stored and is checked again when the engine loads it.

    Raises:
        EngineCorruptError: adapters on an engine without LoRA slots, or an adapter without
            its two files.
    """
    adapters = stored_adapters(engine_dir)
    if not adapters:
        return {}
    if not manifest.lora:
        raise EngineCorruptError(
            f"{engine_dir / ADAPTERS_DIR} holds adapters, but the engine has no LoRA slots; "
            "remove it, or rebuild the engine with --enable-lora"
        )
    files = {}
    for name, path in adapters.items():
        for file in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            if not (path / file).is_file():
                raise EngineCorruptError(
                    f"adapter {name!r} has no {path / file}; store it with `llmc lora add`"
                )
            files[f"{ADAPTERS_DIR}/{name}/{file}"] = sha256_file(path / file)
    return files


def verify_adapters(entry: IndexEntry, engine_dir: Path) -> None:
    """Re-hash the adapters of ``entry`` in its engine directory; EngineCorruptError naming an
    adapter file missing or edited."""
    todo = f"delete {engine_dir}: it is assembled again from the registry's blobs"
    for relative, digest in entry.lora_files.items():
        path = engine_dir / relative
        found = sha256_file(path) if path.is_file() else "missing"
        if found != digest:
            raise EngineCorruptError(
                f"adapter file {path} is {found}, the signed entry lists {digest}: it was edited "
                f"after the engine was published; {todo}"
            )


def draft_files(engine_dir: Path, manifest) -> dict[str, str]:
    """The draft engine's files of ``engine_dir`` (``IndexEntry.draft_files``): its manifest,
    which must have the digest ``manifest`` records for it, and the files that one lists; {}
    without a draft.

    Raises:
        EngineCorruptError: the draft's manifest is missing, not one, or not the one recorded.
    """
    if manifest.draft is None:
        return {}
    path = engine_dir / DRAFT_DIR / MANIFEST_NAME
    todo = f"rebuild the engine with `llmc build ... --draft {manifest.draft.get('quant')}`"
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise EngineCorruptError(
            f"the draft engine's manifest {path} cannot be read ({error}); {todo}"
        ) from error
    digest = hashlib.sha256(raw).hexdigest()
    if digest != manifest.draft.get("manifest_sha256"):
        raise EngineCorruptError(
            f"the draft engine's manifest {path} has sha256 {digest}, but "
            f"{engine_dir / MANIFEST_NAME} records {manifest.draft.get('manifest_sha256')}; {todo}"
        )
    files = parse_manifest(raw, str(path)).files
    return {
        f"{DRAFT_PREFIX}{MANIFEST_NAME}": digest,
        **{DRAFT_PREFIX + k: v for k, v in files.items()},
    }
