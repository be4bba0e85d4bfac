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

_DIR = Path(__file__).parent
#: The sources the library is built from (relative to ``llmc/plugins``), in the order
#: ``setup.py`` hashes them (its ``OP_HASHED``): the ops' own sources and headers, then the
#: attention kernel's (cpu.py's ``_HASHED``).
OP_SOURCES = (
    "ort_custom_op.c",
    "paged_attention/ort_op.c",
    "int8_matmul/ort_matmul.c",
    "int8_matmul/int8_matmul.c",
    "int8_matmul/vnni.c",
    "int8_matmul/amx.c",
    "rms_norm/ort_rms_norm.c",
    "qkv_rope/ort_qkv_rope.c",
    "ort_custom_op.h",
    "int8_matmul/ort_matmul.h",
    "int8_matmul/int8_matmul.h",
    "int8_matmul/int8_matmul_internal.h",
    "rms_norm/ort_rms_norm.h",
    "rms_norm/rms_norm_row.h",
    "qkv_rope/ort_qkv_rope.h",
    "paged_attention/paged_attention.c",
    "paged_attention/check_metadata.c",
    "paged_attention/kv_codes.c",
    "paged_attention/decode.c",
    "paged_attention/prefill_tiles.c",
    "paged_attention/prefill_amx.c",
    "paged_attention/thread_pool.c",
    "paged_attention/paged_attention.h",
    "paged_attention/attention_parts.h",
    "paged_attention/kv_codes.h",
    "paged_attention/thread_pool.h",
    "paged_attention/accumulate_avx2.h",
    "paged_attention/prefill_softmax.h",
    "simd_math.h",
    "amx_tiles.h",
)


def _sources_sha256() -> str | None:
    paths = [_DIR.parent / name for name in OP_SOURCES]
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
