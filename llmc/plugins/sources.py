"""What llmc's two C libraries are built from: the one list ``setup.py`` compiles and hashes and
the loaders (``paged_attention.cpu``, ``paged_attention.ort_op``) check a built library against.

Paths are relative to ``llmc/plugins``. This module imports nothing: ``setup.py`` reads it with
``runpy`` before any dependency is installed.
"""

#: The attention kernel's C sources, compiled together into each library, and the accuracy
#: report's logit scoring (``logit_scores``), which runs on the kernel's thread pool.
KERNEL_SOURCES = (
    "paged_attention/paged_attention.c",
    "paged_attention/check_metadata.c",
    "paged_attention/kv_codes.c",
    "paged_attention/decode.c",
    "paged_attention/prefill_tiles.c",
    "paged_attention/prefill_amx.c",
    "paged_attention/thread_pool.c",
    "logit_scores/logit_scores.c",
)
#: The headers they include.
KERNEL_HEADERS = (
    "paged_attention/paged_attention.h",
    "paged_attention/attention_parts.h",
    "paged_attention/kv_codes.h",
    "paged_attention/thread_pool.h",
    "paged_attention/accumulate_avx2.h",
    "paged_attention/prefill_softmax.h",
    "simd_math.h",
    "amx_tiles.h",
)
#: Everything the ctypes kernel is built from, in the order its digest hashes it.
KERNEL_HASHED = KERNEL_SOURCES + KERNEL_HEADERS
#: The custom-op library's C sources beyond the kernel's, and the headers they include.
OP_OWN_SOURCES = (
    "ort_custom_op.c",
    "paged_attention/ort_op.c",
    "int8_matmul/ort_matmul.c",
    "int8_matmul/int8_matmul.c",
    "int8_matmul/vnni.c",
    "int8_matmul/avx2.c",
    "int8_matmul/amx.c",
    "rms_norm/ort_rms_norm.c",
    "qkv_rope/ort_qkv_rope.c",
)
OP_OWN_HEADERS = (
    "ort_custom_op.h",
    "int8_matmul/ort_matmul.h",
    "int8_matmul/int8_matmul.h",
    "int8_matmul/int8_matmul_internal.h",
    "rms_norm/ort_rms_norm.h",
    "rms_norm/rms_norm_row.h",
    "qkv_rope/ort_qkv_rope.h",
)
#: The custom-op library's C sources.
OP_SOURCES = OP_OWN_SOURCES + KERNEL_SOURCES
#: Everything the custom-op library is built from, in the order its digest hashes it.
OP_HASHED = OP_OWN_SOURCES + OP_OWN_HEADERS + KERNEL_HASHED
#: gcc flags of both libraries: built for the host they run on, like a CPU engine.
COMPILE_FLAGS = ("-O3", "-fopenmp-simd", "-pthread", "-march=native", "-fno-math-errno")
