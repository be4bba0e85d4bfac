"""The backends of ``llmc build``, by name: a new backend is one module and one line here."""

from __future__ import annotations

from llmc.compiler.backends.onnxruntime.backend import OnnxRuntimeBackend
from llmc.compiler.backends.protocol import Backend
from llmc.compiler.backends.tensorrt.backend import TensorRTBackend
from llmc.compiler.backends.tensorrt.rtx_backend import TensorRTRtxBackend
from llmc.errors import BuildConfigError

BACKENDS: dict[str, Backend] = {
    "onnxruntime": OnnxRuntimeBackend(),
    "tensorrt": TensorRTBackend(),
    "tensorrt-rtx": TensorRTRtxBackend(),
}


def backend_for(arch: str) -> Backend:
    """The backend that builds ``--arch`` ``arch``: the first in ``BACKENDS`` that accepts it.
    Raises BuildConfigError when none does."""
    for backend in BACKENDS.values():
        if backend.accepts(arch):
            return backend
    raise BuildConfigError(f"no backend builds --arch {arch} (backends: {', '.join(BACKENDS)})")
