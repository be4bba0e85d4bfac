"""``llmc::RMSNorm`` and ``llmc::SkipRMSNorm``: the RMS norm over the last axis, alone or of a
residual sum, on our C kernel.

The ONNX Runtime op (``ort_rms_norm.c``) is built into the custom-op library of
``llmc.plugins.paged_attention.ort_op`` (``setup.py``); the CPU lowering
(``llmc.compiler.backends.onnxruntime.rewrites.rms_norm``) puts the ops in place of ONNX Runtime's
norm kernels in a cpu
engine's single graph.
"""
