"""Digests and atomic writes: the two things every registry operation relies on.

A blob is named by the sha256 of its bytes, so checking one is re-hashing it. Every file the
registry writes goes to a temporary name in the destination directory first, is fsynced, and is
then renamed over its final name (``os.replace`` is atomic on POSIX within one file system), so a
reader sees either the old file or the whole new one, and a crash leaves only a temporary file
that ``gc`` removes.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from llmc.engine.files import sha256_file
from llmc.errors import BlobCorruptError, EngineCorruptError

CHUNK_BYTES = 1 << 20
PARTIAL_SUFFIX = ".partial"
_DIGEST = re.compile(r"[0-9a-f]{64}")


def is_digest(text: str) -> bool:
    """Whether ``text`` is a full sha256 hex digest (64 lowercase hex characters)."""
    return _DIGEST.fullmatch(text) is not None


def check_digest(expected: str, actual: str, what: str) -> None:
    """Refuse content whose sha256 ``actual`` is not ``expected``.

    Raises:
        BlobCorruptError: naming the blob by its expected digest, ``what`` it is, and the digest
            found.
    """
    if actual != expected:
        raise BlobCorruptError(
            f"blob sha256:{expected} ({what}) is corrupt: its content hashes to sha256:{actual}; "
            "it was tampered with or truncated. Nothing was written from it; re-push the engine "
            "from a good copy, or `llmc registry rm` it and rebuild"
        )


def write_stream_atomic(
    source: BinaryIO | Iterable[bytes],
    path: Path,
    expected: str | None = None,
    what: str = "",
    mode: int | None = None,
) -> str:
    """Copy ``source`` (a binary file object or an iterable of chunks) to ``path`` atomically.

    Writes ``path.parent/.<name>.*.partial``, fsyncs it, checks its sha256 against ``expected``
    (if given), sets ``mode`` (if given), renames it over ``path``. On any error the temporary
    file is removed and the error re-raised. Returns the sha256 of the bytes.

    Raises:
        BlobCorruptError: the bytes do not hash to ``expected`` (``what`` names the source);
            ``path`` is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX, dir=path.parent)
    digest = hashlib.sha256()
    chunks = iter(lambda: source.read(CHUNK_BYTES), b"") if hasattr(source, "read") else source
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                digest.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        if expected is not None:
            check_digest(expected, digest.hexdigest(), what or str(path))
        if mode is not None:
            os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return digest.hexdigest()


def check_checkout(checkout: Path, manifest_digest: str, what: str) -> None:
    """Refuse a checkout whose ``manifest.json`` is not the registry's manifest blob
    ``manifest_digest`` (the one the index names and a signature covers). A checkout is reused
    once assembled, so a file edited there later is caught here, not at pull; the loader then
    checks every other file against this manifest.

    Raises:
        EngineCorruptError: the checkout's manifest is missing or differs; the message names
            the checkout, both digests, and how to assemble it again.
    """
    path = checkout / "manifest.json"
    actual = sha256_file(path) if path.is_file() else "nothing (it is missing)"
    if actual != manifest_digest:
        raise EngineCorruptError(
            f"the checkout {checkout} of {what} was altered: its manifest.json hashes to "
            f"{actual}, but the registry's manifest is sha256:{manifest_digest}. Delete "
            f"{checkout} (it is assembled again from the registry's blobs) and run "
            "`llmc registry verify`"
        )
