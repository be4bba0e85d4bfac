"""8-bit weight-only (W8A16): ``X -> MatMul <- DQ(int8 W, block-wise along K)``.

Not a ``--quant`` choice: the format ``--weight-only8`` gives the modules whose activations or
weights lose too much in the build's format (by default the vocabulary projection of every
``--quant``, and int4's ``*.down_proj``; llama.cpp's Q4_K_M likewise keeps its output tensor at
~6 bits), or every module (``--quant int8 --recipe weight-only``). Blocks of
``--weight-only8-block-size`` input channels (32 by default, as llama.cpp's Q8_0). ONNX Runtime
runs it as ``MatMulNBits``; TensorRT dequantizes block-wise only FP4, FP8 and INT4, so its
lowering makes the weights per-channel INT8 (``llmc.compiler.quantize.formats.int8_weights``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from llmc.compiler.quantize.formats.int8_weights import (
    blockwise_int8_to_per_channel,
    lazy_blockwise_int8_to_per_channel,
)
from llmc.compiler.quantize.rounding import rounded
from llmc.quant.grids import INT8, QuantizedWeight, quantize_weight_blockwise
from llmc.quant.protocol import ActivationStats, QuantFormat, QuantizedLinear, QuantSpec

if TYPE_CHECKING:
    import onnx_ir as ir

#: Output channels quantized at a time.
COLUMNS = 8192


class Int8WeightOnly(QuantFormat):
    """The 8-bit weight-only `QuantFormat` that ``--weight-only8`` modules get (see the
    module docstring)."""

    name = "int8_weight_only"
    label = "int8_weight_only"
    summary = "8-bit weight-only, block-wise"
    offered = False
    needs_stats = False
    cpu_kernel = "MatMulNBits"
    weight_bytes = 1.0 + 4 / 32  # a float32 scale per 32 (the smallest block)
    fallbacks = ()
    reads_column_slices = True

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        # Output channels are independent (blocks run along K, GPTQ's updates too), so a wide
        # weight (a vocabulary projection: 262,144 columns) is quantized COLUMNS at a time into
        # preallocated codes and scales: the float temporaries of rounding stay a few MB
        # instead of several copies of it, and a ``WeightColumns`` weight is widened a slice
        # at a time.
        k, n = weight.shape
        block = spec.weight_only8_block_size
        data = np.empty((k, n), INT8.dtype)
        scale = np.empty((-(-k // block), n), np.float32)
        rounding = "nearest"
        for c in range(0, n, COLUMNS):
            w = np.ascontiguousarray(weight[:, c : c + COLUMNS], dtype=np.float32)
            qw, rounding = rounded(quantize_weight_blockwise(w, INT8, block), w, stats, None, spec)
            data[:, c : c + COLUMNS], scale[:, c : c + COLUMNS] = qw.data, qw.scale
            del w, qw
        qw = QuantizedWeight(data, scale, 0, block, INT8)
        return QuantizedLinear(qw, record={"rounding": rounding, "format": self.label})

    def rewrite_for_tensorrt(self, model: onnx.ModelProto | ir.Model) -> int:
        # An onnx_ir model is a streamed build's graph: its weights are rewritten lazily, one
        # at a time when the stage is written (``tensorrt.lower.lower_streamed``).
        if isinstance(model, onnx.ModelProto):
            return blockwise_int8_to_per_channel(model)
        return lazy_blockwise_int8_to_per_channel(model)


FORMAT = Int8WeightOnly()
