"""``llmc::BlockInt8MatMul``: MatMulNBits' 8-bit weights at int8 compute, our VNNI kernel.

The C kernel (``int8_matmul.c``: packing and activation quantization; ``vnni.c`` and ``amx.c``:
the GEMMs) and its ONNX Runtime op (``ort_matmul.c``) are built into the custom-op library of
``llmc.plugins.paged_attention.ort_op`` (``setup.py``); the CPU lowering
(``llmc.compiler.backends.onnxruntime.rewrites.int8_matmul``) puts the op in place of
``MatMulNBits`` where it is faster.
"""

from __future__ import annotations

from llmc.plugins.paged_attention import ort_op

#: The op's type in the ``llmc`` domain.
OP_TYPE = "BlockInt8MatMul"
#: The ISA features the kernel's tiles run on, best first (``llmc.engine.isa`` names).
KERNEL_ISAS = ("avx512-vnni", "avx2")


def block_int8_matmul_isa(host_features: tuple[str, ...]) -> str | None:
    """The ISA feature an engine built here runs BlockInt8MatMul's tiles on (the first of
    ``KERNEL_ISAS`` the host has), or None where it has neither or the custom-op library is not
    built (``setup.py``)."""
    if ort_op.library_path() is None:
        return None
    return next((isa for isa in KERNEL_ISAS if isa in host_features), None)
