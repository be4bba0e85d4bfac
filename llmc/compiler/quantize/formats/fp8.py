"""``--quant fp8``: W8A8 in FP8 E4M3FN,
``X -> Q/DQ(fp8, per-tensor) -> MatMul <- DQ(fp8 W, per-channel)``.

FP8 tensor cores arrive with Ada (sm89). ONNX Runtime's CPU EP has no FP8 GEMM: CPU engines
replace each FP8 weight DequantizeLinear by the float32 weight it produces and run the
activation Q/DQ pairs as emulation (correct, not fast), which lets a CPU-only CI check an FP8
build's accuracy; the TensorRT graph keeps the FP8 weights.

Defaults, measured on Gemma 3 270M (benchmarks/RESULTS.md): the vocabulary projection 8-bit
weight-only (E4M3's 3 mantissa bits on a 262,144-row projection flip the argmax); the max
observer (FP8's range is wide: mean KL 0.024 against 0.040 with percentile).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from llmc.calibration.observers import observe_amax
from llmc.compiler.quantize.rounding import rounded
from llmc.quant.grids import FP8_E4M3, QuantizedWeight, quantize_weight_per_channel
from llmc.quant.protocol import (
    ActivationQuant,
    ActivationStats,
    FormatDefaults,
    QuantFormat,
    QuantizedLinear,
    QuantSpec,
)


class Fp8(QuantFormat):
    """The `QuantFormat` of ``--quant fp8`` (see the module docstring); min_sm 89."""

    name = "fp8"
    label = "fp8_w8a8"
    summary = "W8A8 E4M3"
    defaults = FormatDefaults("max", weight_only8="lm_head")
    cpu_kernel = "QuantizeLinear"  # emulation: the activation Q/DQ pairs remain
    weight_bytes = 1.0
    min_sm = 89

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        amax = observe_amax(stats, spec.calib_method, FP8_E4M3)
        nearest = quantize_weight_per_channel(weight, FP8_E4M3)
        qw, rounding = rounded(nearest, weight, stats, None, spec)
        record = {"format": self.label, "act_amax": amax, "rounding": rounding}
        return QuantizedLinear(qw, None, ActivationQuant(FP8_E4M3, amax), record)

    def target_error(self, target: str, spec: QuantSpec) -> str | None:
        if self.runs_on(target):
            return None
        return (
            f"--quant fp8 needs FP8 tensor cores (sm{self.min_sm} or newer); {target} has none: "
            "use int8 or int4, or a newer --arch"
        )

    def cpu_weight(self, weight: QuantizedWeight) -> np.ndarray:
        return fp8_weight(weight.data, weight.scale, weight.axis)

    def rewrite_for_cpu(self, model: onnx.ModelProto) -> int:
        return emulate_fp8_weights(model)


def fp8_weight(codes: np.ndarray, scale: np.ndarray, axis: int) -> np.ndarray:
    """The float32 weight an FP8 per-channel DequantizeLinear gives (``axis``: the scale's)."""
    q = codes.astype(np.float32)
    return (q * (scale[None, :] if axis == 1 else scale[:, None])).astype(np.float32)


def emulate_fp8_weights(model: onnx.ModelProto) -> int:
    """CPU lowering of FP8 engines: replace each FP8 weight DequantizeLinear by the float32
    weight it produces (the same values, computed once at build time); returns how many.

    ONNX Runtime's CPU EP has no FP8 GEMM, and its QDQ fusion turns an FP8 DQ + MatMul into
    MatMulIntegerToFloat, which then rejects float8 inputs at load (measured, ORT 1.31). With
    float weights the activation Q/DQ pairs stay and run as emulation, while the int8
    weight-only layers of the same engine still fuse into MatMulNBits.
    """
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    fp8 = onnx.TensorProto.FLOAT8E4M3FN
    # FP8 tensors dequantized into another DQ's scale are NVFP4's block scales (its rewrite)
    scales = {n.input[1] for n in g.node if n.op_type == "DequantizeLinear"}
    done = 0
    for node in list(g.node):
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        if node.output[0] in scales:
            continue
        data = inits[node.input[0]]
        if data.data_type != fp8:
            continue
        scale = numpy_helper.to_array(inits[node.input[1]])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        w = fp8_weight(numpy_helper.to_array(data), scale, axis)
        g.initializer.append(numpy_helper.from_array(w, node.output[0]))
        g.node.remove(node)
        done += 1
    used = {i for n in g.node for i in n.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return done


FORMAT = Fp8()
