"""8-bit weight-only (W8A16): ``X -> MatMul <- DQ(int8 W, block-wise along K)``.

Not a ``--quant`` choice: the format ``--weight-only8`` gives the modules whose activations or
weights lose too much in the build's format (by default the vocabulary projection of every
``--quant``, and int4's ``*.down_proj``; llama.cpp's Q4_K_M likewise keeps its output tensor at
~6 bits). Blocks of ``--int4-block-size`` input channels. ONNX Runtime runs it as
``MatMulNBits``; TensorRT dequantizes block-wise only FP4, FP8 and INT4, so its lowering makes
the weights per-channel INT8 (``llmc.compiler.tensorrt.int8_weights``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from llmc.compiler.quantize.rounding import rounded
from llmc.compiler.tensorrt.int8_weights import (
    blockwise_int8_to_per_channel,
    lazy_blockwise_int8_to_per_channel,
)
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
    weight_bytes = 1.0 + 4 / 128  # a float32 scale per 128
    fallbacks = ()

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        # Output channels are independent (blocks run along K, GPTQ's updates too), so a wide
        # weight (a vocabulary projection: 262,144 columns) is quantized COLUMNS at a time:
        # the float temporaries of rounding stay a few MB instead of several copies of it.
        parts = []
        for c in range(0, weight.shape[1], COLUMNS):
            w = np.ascontiguousarray(weight[:, c : c + COLUMNS], dtype=np.float32)
            qw = quantize_weight_blockwise(w, INT8, spec.int4_block_size)
            parts.append(rounded(qw, w, stats, None, spec))
        first = parts[0][0]
        qw = QuantizedWeight(
            np.concatenate([q.data for q, _ in parts], axis=1),
            np.concatenate([q.scale for q, _ in parts], axis=1),
            first.axis,
            first.block_size,
            first.grid,
        )
        record = {"rounding": parts[0][1], "format": self.label}
        return QuantizedLinear(qw, record=record)

    def rewrite_for_tensorrt(self, model: onnx.ModelProto | ir.Model) -> int:
        # An onnx_ir model is a streamed build's graph: its weights are rewritten lazily, one
        # at a time when the stage is written (``tensorrt.lower.lower_streamed``).
        if isinstance(model, onnx.ModelProto):
            return blockwise_int8_to_per_channel(model)
        return lazy_blockwise_int8_to_per_channel(model)


FORMAT = Int8WeightOnly()
