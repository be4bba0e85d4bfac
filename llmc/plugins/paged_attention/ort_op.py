"""``llmc::PagedAttention`` as an ONNX Runtime custom op: the library built from ``ort_op.c``.

``setup.py`` builds ``_paged_attention_ort*.so`` next to this file when ORT's C API header is
available (Debian's libonnxruntime-dev, fetched at install). A session created with
:func:`register` runs PagedAttention nodes with the same kernel as ``cpu.py``, on ORT's intra-op
pool, writing the KV caches (graph inputs) in place.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import warnings
from pathlib import Path

from llmc.plugins.sources import OP_HASHED

_DIR = Path(__file__).parent


def _sources_sha256() -> str | None:
    paths = [_DIR.parent / name for name in OP_HASHED]
    if not all(p.exists() for p in paths):
        return None
    return hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()


@functools.cache
def library_path() -> Path | None:
    """The built custom-op library, or None if it was not built (no ORT header at install) or
    was built from older sources (with a warning: run ``pip install -e .`` to rebuild)."""
    expected = _sources_sha256()
    for path in sorted(_DIR.glob("_paged_attention_ort*.so")):
        built = ctypes.CDLL(str(path)).llmc_ort_op_source_sha256
        built.restype = ctypes.c_char_p
        if expected is None or built().decode() == expected:
            return path
        warnings.warn(
            f"{path.name} was built from older sources; not using it (run `pip install -e .` "
            "to rebuild the PagedAttention custom op)",
            stacklevel=2,
        )
    return None


def register(session_options) -> bool:
    """Register the op's ``llmc`` domain on ``onnxruntime.SessionOptions``; False (and nothing
    registered) when the library is not available (see :func:`library_path`)."""
    path = library_path()
    if path is None:
        return False
    session_options.register_custom_ops_library(str(path))
    return True
