"""Builds llmc's C kernels; everything else about the package is in pyproject.toml.

Two shared libraries, neither a Python module (no PyInit), both in
``llmc/plugins/paged_attention/``:

- ``_paged_attention_cpu*.so``: the paged-attention kernel, loaded with ctypes by ``cpu.py``.
- ``_paged_attention_ort*.so``: llmc's ONNX Runtime custom ops (``ort_op.c``): the same
  attention kernel, and ``llmc::BlockInt8MatMul`` (``llmc/plugins/int8_matmul/``), loaded by ORT
  (``SessionOptions.register_custom_ops_library``). It needs ORT's C API header,
  which no PyPI wheel of onnxruntime ships (onnxruntime issue #18840); it is taken from Debian's
  ``libonnxruntime-dev`` package (pinned by sha256), or from ``$LLMC_ORT_INCLUDE``. Without the
  header the library is skipped with a warning and CPU engines run in segments (ort_runner.py).

Built with ``-march=native``: like a CPU engine, the build is for the host it runs on.
``pip install -e .`` or ``python setup.py build_ext --inplace`` puts them next to cpu.py.
"""

import hashlib
import io
import lzma
import os
import runpy
import tarfile
import urllib.request
import warnings
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).parent
PLUGINS = "llmc/plugins"
# The lists of sources and headers: one definition, also read by the loaders (cpu.py, ort_op.py).
_SOURCES = runpy.run_path(str(ROOT / PLUGINS / "sources.py"))
KERNEL_SOURCES, KERNEL_HASHED = _SOURCES["KERNEL_SOURCES"], _SOURCES["KERNEL_HASHED"]
OP_SOURCES, OP_HASHED = _SOURCES["OP_SOURCES"], _SOURCES["OP_HASHED"]
COMPILE_FLAGS = list(_SOURCES["COMPILE_FLAGS"])


def sha256_of(names: tuple[str, ...]) -> str:
    """The sha256 of the files (relative to PLUGINS) concatenated in order."""
    return hashlib.sha256(
        b"".join((ROOT / PLUGINS / name).read_bytes() for name in names)
    ).hexdigest()


# Embedded so cpu.py can tell an extension built from older sources and rebuild instead.
SOURCE_SHA256 = sha256_of(KERNEL_HASHED)
# Embedded so ort_op.py can tell a custom-op library built from older sources.
OP_SOURCE_SHA256 = sha256_of(OP_HASHED)

# Debian trixie's ORT development headers: ORT_API_VERSION 21 (1.21). ORT keeps its C API
# append-only, so an op built against them loads in the onnxruntime 1.31 we run.
ORT_HEADERS_DEB = (
    "http://deb.debian.org/debian/pool/main/o/onnxruntime/libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb",
    "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08",
)
ORT_HEADER = "onnxruntime_c_api.h"


def _deb_member(deb: bytes, name: str) -> bytes:
    """A member of a .deb (an ar archive: 8-byte magic, then 60-byte headers, 2-byte aligned)."""
    if deb[:8] != b"!<arch>\n":
        raise ValueError("not an ar archive")
    pos = 8
    while pos + 60 <= len(deb):
        header = deb[pos : pos + 60]
        member, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        pos += 60
        if member == name:
            return deb[pos : pos + size]
        pos += size + (size & 1)
    raise ValueError(f"{name} not in the archive")


def ort_include_dir() -> Path | None:
    """A directory holding onnxruntime_c_api.h: $LLMC_ORT_INCLUDE, or Debian's header fetched
    once into build/ort-include. None (with a warning) if neither is possible."""
    if os.environ.get("LLMC_ORT_INCLUDE"):
        return Path(os.environ["LLMC_ORT_INCLUDE"])
    target = ROOT / "build" / "ort-include"
    if (target / ORT_HEADER).exists():
        return target
    url, sha256 = ORT_HEADERS_DEB
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            deb = response.read()
        if hashlib.sha256(deb).hexdigest() != sha256:
            raise ValueError(f"sha256 mismatch for {url}")
        with tarfile.open(
            fileobj=io.BytesIO(lzma.decompress(_deb_member(deb, "data.tar.xz")))
        ) as tar:
            header = tar.extractfile(f"./usr/include/onnxruntime/{ORT_HEADER}").read()
    except (OSError, ValueError, KeyError, tarfile.TarError, lzma.LZMAError) as e:
        warnings.warn(
            f"llmc: no ONNX Runtime C header ({e}); building without the PagedAttention custom "
            "op, so CPU engines will run in segments (slower). Set LLMC_ORT_INCLUDE to a directory "
            f"with {ORT_HEADER} to build it.",
            stacklevel=1,
        )
        return None
    target.mkdir(parents=True, exist_ok=True)
    (target / ORT_HEADER).write_bytes(header)
    return target


def extensions() -> list[Extension]:
    """The C libraries to build: the ctypes kernel always; the ORT custom ops (the kernel and
    the ops' sources) only when ``ort_include_dir`` finds ORT's C header (no error otherwise: a
    warning, and CPU engines then run in segments)."""
    kernel = Extension(
        "llmc.plugins.paged_attention._paged_attention_cpu",
        sources=[f"{PLUGINS}/{name}" for name in KERNEL_SOURCES],
        define_macros=[("LLMC_PA_SOURCE_SHA256", f'"{SOURCE_SHA256}"')],
        extra_compile_args=COMPILE_FLAGS,
        extra_link_args=["-pthread"],
    )
    include = ort_include_dir()
    if include is None:
        return [kernel]
    op = Extension(
        "llmc.plugins.paged_attention._paged_attention_ort",
        sources=[f"{PLUGINS}/{name}" for name in OP_SOURCES],
        include_dirs=[
            str(include),
            PLUGINS,
            f"{PLUGINS}/paged_attention",
            f"{PLUGINS}/int8_matmul",
            f"{PLUGINS}/rms_norm",
            f"{PLUGINS}/qkv_rope",
        ],
        define_macros=[
            ("LLMC_PA_SOURCE_SHA256", f'"{SOURCE_SHA256}"'),
            ("LLMC_ORT_OP_SOURCE_SHA256", f'"{OP_SOURCE_SHA256}"'),
        ],
        extra_compile_args=COMPILE_FLAGS,
        extra_link_args=["-pthread"],
    )
    return [kernel, op]


setup(ext_modules=extensions())
