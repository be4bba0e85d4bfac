"""``llmc::QKVRoPE``: a fused QKV projection's output split into q, k and v, each q and k head
RMS-normalized and rotated (Gemma 3's q_norm / k_norm and RoPE), in one op.

The ONNX Runtime op (``ort_qkv_rope.c``) is built into the custom-op library of
``llmc.plugins.paged_attention.ort_op`` (``setup.py``); the CPU lowering
(``llmc.compiler.backends.onnxruntime.rewrites.qkv_rope``) puts it in place of the nodes it fuses
in a cpu engine's
single graph.
"""
