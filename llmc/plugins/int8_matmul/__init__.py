"""``llmc::BlockInt8MatMul``: MatMulNBits' 8-bit weights at int8 compute, our VNNI kernel.

The C kernel (``int8_matmul.c``: packing and activation quantization; ``vnni.c`` and ``amx.c``:
the GEMMs) and its ONNX Runtime op (``ort_matmul.c``) are built into the custom-op library of
``llmc.plugins.paged_attention.ort_op`` (``setup.py``); the CPU lowering
(``llmc.compiler.backends.onnxruntime.rewrites.int8_matmul``) puts the op in place of
``MatMulNBits`` where it is faster.
"""
