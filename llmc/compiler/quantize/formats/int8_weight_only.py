"""8-bit weight-only (W8A16): ``X -> MatMul <- DQ(int8 W, block-wise along K)``.

Not a ``--quant`` choice: the format ``--weight-only8`` gives the modules whose activations or
weights lose too much in the build's format (by default the vocabulary projection of every
``--quant``, and int4's ``*.down_proj``; llama.cpp's Q4_K_M likewise keeps its output tensor at
~6 bits). Blocks of ``--int4-block-size`` input channels. ONNX Runtime runs it as
``MatMulNBits``; TensorRT dequantizes block-wise only FP4, FP8 and INT4, so its lowering makes
the weights per-channel INT8 (``llmc.compiler.tensorrt.int8_weights``).
"""

from __future__ import annotations

import numpy as np
import onnx

from llmc.compiler.quantize.rounding import rounded
from llmc.compiler.tensorrt.int8_weights import blockwise_int8_to_per_channel
from llmc.quant.grids import INT8, quantize_weight_blockwise
from llmc.quant.protocol import ActivationStats, QuantFormat, QuantizedLinear, QuantSpec


class Int8WeightOnly(QuantFormat):
    """The 8-bit weight-only `QuantFormat` that ``--weight-only8`` modules get (see the
    module docstring)."""

    name = "int8_weight_only"
    label = "int8_weight_only"
    summary = "8-bit weight-only, block-wise"
    offered = False
    needs_stats = False
    cpu_kernel = "MatMulNBits"

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        qw = quantize_weight_blockwise(weight, INT8, spec.int4_block_size)
        qw, rounding = rounded(qw, weight, stats, None, spec)
        return QuantizedLinear(qw, record={"rounding": rounding, "format": self.label})

    def rewrite_for_tensorrt(self, model: onnx.ModelProto) -> int:
        return blockwise_int8_to_per_channel(model)


FORMAT = Int8WeightOnly()
