"""``--quant nvfp4``: W4A4 in NVIDIA's FP4 with two-level scales,
``X -> dynamic FP4 Q/DQ (blocks of 16) -> MatMul <- DQ(FP4 W, DQ(E4M3 block scales, g))``.

Numerics (E2M1 elements, an E4M3 scale per 16 input channels, a float32 per-tensor scale):
``llmc.quant.microscaling``; the graph TensorRT 11 imports (``TRT_FP4DynamicQuantize`` for the
activations, a two-level DequantizeLinear for the weights) and its sources:
``llmc.compiler.quantize.microscaling_graph``. FP4 tensor cores arrive with Blackwell (sm100);
older targets are refused. Activations are quantized per block at run time; their per-tensor
scale is static, amax / (6 * 448) with amax the calibration's max |x| (it only sets the range of
the block scales, so ``--calib-method`` does not change it). K must be a multiple of 16.

ONNX Runtime's CPU EP has no FP4 GEMM: CPU engines run the weights as the float32 values they
dequantize to and emulate the activations' quantization bit for bit with standard ops
(``microscaling_emulation``), so a CPU-only CI can build an NVFP4 engine and check its accuracy.

Weight rounding: GPTQ (``--weight-rounding gptq``, the default) re-chooses the E2M1 codes with
the block scales fixed, as for every other grid: ``gptq_on_grid`` takes block-wise scales, and
the E2M1 grid rounds in torch (``E2M1Grid.round_torch``). A block whose E4M3 scale is 0 stays 0.

Defaults, as ``--quant fp8``'s: the vocabulary projection 8-bit weight-only, the max observer,
and the KV cache in FP8 (``--kv-cache-dtype auto``): a 4-bit model's cache in 16 bits would
dominate its memory at long contexts, and every NVFP4 target has FP8. Not yet measured on
Gemma 3 270M (benchmarks/RESULTS.md has no NVFP4 row).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx

from llmc.compiler.quantize.formats.microscaling_emulation import (
    MARKER,
    emulate_nvfp4,
    nvfp4_weight,
)
from llmc.compiler.quantize.rounding import rounded
from llmc.quant.microscaling import (
    FP4_E2M1,
    NVFP4_BLOCK,
    TINY,
    BlockActivationQuant,
    MicroscaledWeight,
    quantize_nvfp4,
)
from llmc.quant.protocol import (
    ActivationStats,
    FormatDefaults,
    QuantFormat,
    QuantizedLinear,
    QuantSpec,
)


class Nvfp4(QuantFormat):
    """The `QuantFormat` of ``--quant nvfp4`` (see the module docstring); min_sm 100."""

    name = "nvfp4"
    label = "nvfp4_w4a4"
    summary = "W4A4 FP4 E2M1, E4M3 scale per 16 + per-tensor scale, sm100+"
    defaults = FormatDefaults("max", weight_only8="lm_head", kv_cache_dtype="fp8")
    cpu_kernel = MARKER  # emulation: one QuantizeLinear (its FP8 block scales) per module
    weight_bytes = 0.5 + 1 / 16  # 4 bits, an 8-bit scale per 16
    min_sm = 100
    fallbacks = ("fp8", "int8_weight_only")  # --accuracy-target: FP8 before 8-bit weight-only

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        nearest = quantize_nvfp4(weight)  # BlockSizeError when K is not a multiple of 16
        # GPTQ divides by the scales: a zero block scale (its elements dequantize to 0) as TINY
        safe = replace(nearest, scale=np.maximum(nearest.scale, TINY))
        qw, rounding = rounded(safe, weight, stats, None, spec)
        amax = float(stats.absmax)
        record = {"format": self.label, "act_amax": amax, "rounding": rounding}
        act = BlockActivationQuant(FP4_E2M1, amax, NVFP4_BLOCK)
        return QuantizedLinear(replace(nearest, data=qw.data), None, act, record)

    def target_error(self, target: str, spec: QuantSpec) -> str | None:
        if self.runs_on(target):
            return None
        return (
            f"--quant nvfp4 needs Blackwell FP4 tensor cores (sm{self.min_sm} or newer); "
            f"{target} has none: use fp8 (sm89+), int8 or int4, or a newer --arch"
        )

    def cpu_weight(self, weight: MicroscaledWeight) -> np.ndarray:
        w = weight
        return nvfp4_weight(w.data, w.block_scale, w.global_scale, w.axis, w.block_size)

    def rewrite_for_cpu(self, model: onnx.ModelProto) -> int:
        return emulate_nvfp4(model)


FORMAT = Nvfp4()
