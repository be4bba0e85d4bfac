"""What a TensorRT for RTX build needs of this host: NVIDIA's two wheels, no GPU.

``tensorrt-rtx-cu13-bindings`` is the Python API (module ``tensorrt_rtx_bindings``, the same API
as ``tensorrt``); ``onnxruntime-ep-nv-tensorrt-rtx-cu13`` carries the libraries
(``libtensorrt_rtx.so.1.7.1``, ``libtensorrt_onnxparser_rtx.so.1.7.1``, ``libtensorrt_plugins.so``)
and, when imported, makes the names the loader looks for (``libtensorrt_rtx.so.1`` for the
bindings, the unversioned ``libtensorrt_rtx.so`` the parser ``dlopen``s when it adds a plugin
layer). glibc reads ``LD_LIBRARY_PATH`` only at process start, so the build runs in a child
process started with that folder on it (``child_environment``); found here without importing
either package (the bindings' import loads the libraries).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

#: The GPU targets TensorRT for RTX builds (its ``trt.ComputeCapability`` also has SM75, SM80 and
#: SM121; sm80 stays with TensorRT 11, llmc's data-center path; no SM90 or SM100 at all).
RTX_ARCHES = ("sm86", "sm89", "sm120")
BINDINGS_MODULE = "tensorrt_rtx_bindings"
LIBRARIES_MODULE = "onnxruntime_ep_nv_tensorrt_rtx"
BINDINGS_DIST = "tensorrt-rtx-cu13-bindings"
LIBRARIES_DIST = "onnxruntime-ep-nv-tensorrt-rtx-cu13"
EXTRA = 'pip install "llmc[tensorrt-rtx]"'


def library_dir() -> Path | None:
    """The folder holding TensorRT for RTX's libraries (the ONNX Runtime EP package's), or
    None when the package is not installed."""
    spec = importlib.util.find_spec(LIBRARIES_MODULE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def bindings_version() -> str | None:
    """The installed bindings' version ("1.7.1.116"), or None."""
    if importlib.util.find_spec(BINDINGS_MODULE) is None:
        return None
    try:
        return importlib.metadata.version(BINDINGS_DIST)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def runtime_version() -> str | None:
    """The bindings' version when both the bindings and the libraries are installed (what a
    host needs to load a plan, besides the GPU), else None."""
    version = bindings_version()
    return version if version is not None and library_dir() is not None else None


def missing_for_build(arch: str) -> list[str]:
    """What this host lacks to build a TensorRT for RTX plan for ``arch``, as phrases for a
    message (empty when it can; no GPU is needed)."""
    missing = []
    if bindings_version() is None:
        missing.append(f"TensorRT for RTX's Python bindings ({BINDINGS_DIST}; {EXTRA})")
    if library_dir() is None:
        missing.append(f"TensorRT for RTX's libraries ({LIBRARIES_DIST}; {EXTRA})")
    return missing


def child_environment() -> dict[str, str]:
    """This process's environment with the libraries' folder first on ``LD_LIBRARY_PATH``.
    Raises FileNotFoundError when the libraries are not installed."""
    folder = library_dir()
    if folder is None:
        raise FileNotFoundError(f"{LIBRARIES_DIST} is not installed ({EXTRA})")
    env = dict(os.environ)
    parts = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(folder), *parts])
    return env
