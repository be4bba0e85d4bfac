"""``--quant mxfp8``: W8A8 in OCP's MXFP8,
``X -> dynamic MXFP8 Q/DQ (blocks of 32) -> MatMul <- DQ(E4M3 W, E8M0 scale per 32)``.

Numerics (E4M3 elements, a power-of-two E8M0 scale per 32 input channels; OCP Microscaling
Formats v1.0): ``llmc.quant.microscaling``; the graph TensorRT 11 imports
(``TRT_MXFP8DynamicQuantize`` and ``TRT_MXFP8DequantizeLinear``) and its sources:
``llmc.compiler.quantize.microscaling_graph``. TensorRT runs MXFP8 on Blackwell's block-scaled
tensor cores (sm100 and newer); older targets are refused. Both weights and activations have
per-block scales from their own values (the activations' at run time), so the format needs no
activation statistics (only GPTQ's, when on). K must be a multiple of 32.

ONNX Runtime's CPU EP has no MXFP8 GEMM: CPU engines run the weights as the float32 values they
dequantize to and emulate the activations' quantization bit for bit with standard ops
(``microscaling_emulation``), so a CPU-only CI can build an MXFP8 engine and check its accuracy.

Weight rounding: GPTQ (the default) re-chooses the E4M3 codes with the block scales fixed
(``gptq_on_grid`` takes block-wise scales; the grid is FP8's).

Defaults, as ``--quant fp8``'s: the vocabulary projection 8-bit weight-only, and the KV cache in
FP8 (``--kv-cache-dtype auto``; every MXFP8 target has FP8). Not yet measured on Gemma 3 270M.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx

from llmc.compiler.quantize.formats.microscaling_emulation import (
    MARKER,
    emulate_mxfp8,
    mxfp8_weight,
)
from llmc.compiler.quantize.rounding import rounded
from llmc.quant.grids import FP8_E4M3
from llmc.quant.microscaling import (
    MXFP8_BLOCK,
    BlockActivationQuant,
    MicroscaledWeight,
    quantize_mxfp8,
)
from llmc.quant.protocol import (
    ActivationStats,
    FormatDefaults,
    QuantFormat,
    QuantizedLinear,
    QuantSpec,
)


class Mxfp8(QuantFormat):
    """The `QuantFormat` of ``--quant mxfp8`` (see the module docstring); min_sm 100."""

    name = "mxfp8"
    label = "mxfp8_w8a8"
    summary = "W8A8 E4M3, E8M0 scale per 32, sm100+"
    needs_stats = False
    defaults = FormatDefaults("max", weight_only8="lm_head", kv_cache_dtype="fp8")
    cpu_kernel = MARKER  # emulation: one QuantizeLinear (its E4M3 elements) per module
    weight_bytes = 1.0 + 1 / 32  # 8 bits, an 8-bit scale per 32
    min_sm = 100

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        nearest = quantize_mxfp8(weight)  # BlockSizeError when K is not a multiple of 32
        qw, rounding = rounded(nearest, weight, stats, None, spec)
        record = {"format": self.label, "rounding": rounding}
        act = BlockActivationQuant(FP8_E4M3, 0.0, MXFP8_BLOCK)
        return QuantizedLinear(replace(nearest, data=qw.data), None, act, record)

    def target_error(self, target: str, spec: QuantSpec) -> str | None:
        if self.runs_on(target):
            return None
        return (
            f"--quant mxfp8 needs Blackwell block-scaled FP8 tensor cores (sm{self.min_sm} or "
            f"newer); {target} has none: use fp8 (sm89+), int8 or int4, or a newer --arch"
        )

    def cpu_weight(self, weight: MicroscaledWeight) -> np.ndarray:
        w = weight
        return mxfp8_weight(w.data, w.block_scale, w.axis, w.block_size)

    def rewrite_for_cpu(self, model: onnx.ModelProto) -> int:
        return emulate_mxfp8(model)


FORMAT = Mxfp8()
