"""The graph form of NVFP4 and MXFP8 that TensorRT 11 imports, and its writers.

TensorRT quantizes activations to these formats only dynamically (a block's scale is computed
from that block at run time), through its DynamicQuantize layer, which ONNX reaches through
custom ops of TensorRT's own ``trt`` domain that onnx-tensorrt imports natively (no plugin).
Per MatMul ``Y = X W`` (W [K, N], blocks along K; X [T, K], blocks along its last axis):

- NVFP4 weights: ``DQ(w: FLOAT4E2M1, DQ(s: FLOAT8E4M3FN [K/16, N], g: float32 scalar),
  axis=0, block_size=16)``: a two-level ("double quantization") DequantizeLinear whose scale is
  itself the DequantizeLinear of the FP8 block scales with the per-tensor scale.
- NVFP4 activations: ``xq, xs = trt::TRT_FP4DynamicQuantize(X, g_x; axis=-1, block_size=16,
  scale_type=FLOAT8E4M3FN)`` (FP4 data, FP8 block scales), then
  ``DQ(xq, DQ(xs, g_x), axis=-1, block_size=16)``; ``g_x`` is the static (calibrated) per-tensor
  scale, a constant scalar.
- MXFP8 weights: ``trt::TRT_MXFP8DequantizeLinear(w: FLOAT8E4M3FN, e: uint8 [K/32, N];
  axis=0, block_size=32, output_dtype=FLOAT)``, e the biased E8M0 exponents (TensorRT reads a
  uint8 scale of this op as E8M0).
- MXFP8 activations: ``xq, xe = trt::TRT_MXFP8DynamicQuantize(X; axis=-1, block_size=32,
  output_dtype=FLOAT8E4M3FN)``, then ``trt::TRT_MXFP8DequantizeLinear(xq, xe; axis=-1,
  block_size=32, output_dtype=FLOAT)``.

Sources: NVIDIA Model Optimizer (github.com/NVIDIA/TensorRT-Model-Optimizer),
``modelopt/torch/quantization/export_onnx.py`` (``export_fp4``: dynamic input quantizer as
``TRT_FP4DynamicQuantize`` + two DequantizeLinear; ``export_mxfp8``), its ONNX exporters
``modelopt/onnx/export/nvfp4_exporter.py`` (weights: FP4 initializer, "two DQ nodes" with the
FP8 per-block and float32 per-tensor scales) and ``mxfp8_exporter.py`` (FP8 weights, uint8 E8M0
scales, ``TRT_MXFP8DequantizeLinear``), and its export tests (default-domain DequantizeLinear,
``trt``-domain dynamic quantizers with axis -1 and blocks of 16 / 32); onnx/onnx-tensorrt
``builtin_op_importers.cpp`` (``TRT_FP4DynamicQuantize``: block_size 16, scale_type FP8, the
scale a scalar initializer; ``TRT_MXFP8DynamicQuantize``: one float/half/bf16 input, block_size
32; ``TRT_MXFP8DequantizeLinear``: uint8 scale as E8M0; block-wise DequantizeLinear: one
blocked dimension); TensorRT's "DynamicQuantize" operator reference (2-D or 3-D input, blocked
axis the last or second to last, the double-quantization scale a build-time constant) and
"Quantization Schemes" (MXFP8: E8M0 scales per 32, activations need dynamic quantization).
ModelOpt exports weights as [N, K] with axis -1; llmc keeps MatMul's [K, N] with axis 0, as its
INT4 weights do: the blocks run along K either way.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from llmc.quant.microscaling import (
    FP4_E2M1,
    BlockActivationQuant,
    MicroscaledWeight,
    nvfp4_global_scale,
)

TRT_DOMAIN = "trt"
FP4_DYNAMIC_QUANTIZE = "TRT_FP4DynamicQuantize"
MXFP8_DYNAMIC_QUANTIZE = "TRT_MXFP8DynamicQuantize"
MXFP8_DEQUANTIZE = "TRT_MXFP8DequantizeLinear"
#: The ``trt``-domain ops llmc writes (onnx-tensorrt has an importer for each).
TRT_OPS = (FP4_DYNAMIC_QUANTIZE, MXFP8_DYNAMIC_QUANTIZE, MXFP8_DEQUANTIZE)

_FP8 = ir.DataType.FLOAT8E4M3FN.value
_FLOAT = ir.DataType.FLOAT.value


def write_weight(
    graph: ir.Graph, before: ir.Node, prefix: str, qw: MicroscaledWeight, names
) -> ir.Value:
    """Write ``qw``'s dequantization (module docstring) before ``before``; return the float
    weight [K, N]. ``names`` makes unique initializer and node names (``qdq.UniqueNames``)."""
    data = names.initializer(f"{prefix}.weight_quantized", qw.data)
    block_scale = names.initializer(f"{prefix}.weight_block_scale", qw.block_scale)
    attrs = {"axis": qw.axis, "block_size": qw.block_size}
    name = names.node(f"{prefix}/weight_DQ")
    if qw.global_scale is None:  # MXFP8
        attrs["output_dtype"] = _FLOAT
        return _insert(graph, before, [_trt(MXFP8_DEQUANTIZE, [data, block_scale], attrs, name)])
    g = np.array(qw.global_scale, np.float32)  # NVFP4
    g = names.initializer(f"{prefix}.weight_global_scale", g)
    scale = ir.node("DequantizeLinear", [block_scale, g], name=names.node(f"{prefix}/scale_DQ"))
    dq = ir.node("DequantizeLinear", [data, scale.outputs[0]], attrs, name=name)
    return _insert(graph, before, [scale, dq])


def write_activation(
    graph: ir.Graph, before: ir.Node, x: ir.Value, act: BlockActivationQuant, prefix: str, names
) -> ir.Value:
    """Write ``act``'s dynamic quantization of ``x`` [T, K] and its dequantization (module
    docstring) before ``before``; return the dequantized input."""
    block = {"axis": -1, "block_size": act.block_size}
    q_name, dq_name = names.node(f"{prefix}/Q"), names.node(f"{prefix}/DQ")
    if act.grid is not FP4_E2M1:  # MXFP8
        q = _trt(MXFP8_DYNAMIC_QUANTIZE, [x], block | {"output_dtype": _FP8}, q_name, 2)
        dq = _trt(MXFP8_DEQUANTIZE, list(q.outputs), block | {"output_dtype": _FLOAT}, dq_name)
        return _insert(graph, before, [q, dq])
    g = names.initializer(f"{prefix}.global_scale", np.array(nvfp4_global_scale(act.amax)))
    q = _trt(FP4_DYNAMIC_QUANTIZE, [x, g], block | {"scale_type": _FP8}, q_name, 2)
    scale = ir.node("DequantizeLinear", [q.outputs[1], g], name=names.node(f"{prefix}/scale_DQ"))
    dq = ir.node("DequantizeLinear", [q.outputs[0], scale.outputs[0]], block, name=dq_name)
    return _insert(graph, before, [q, scale, dq])


def _insert(graph: ir.Graph, before: ir.Node, nodes: list[ir.Node]) -> ir.Value:
    """Insert ``nodes`` before ``before`` (declaring the ``trt`` opset when one is of it);
    return the last one's output."""
    if any(n.domain == TRT_DOMAIN for n in nodes):
        graph.opset_imports.setdefault(TRT_DOMAIN, 1)
    graph.insert_before(before, nodes)
    return nodes[-1].outputs[0]


def _trt(op: str, inputs: list, attrs: dict, name: str, num_outputs: int = 1) -> ir.Node:
    """A node of TensorRT's ``trt`` domain."""
    return ir.node(op, inputs, attrs, domain=TRT_DOMAIN, num_outputs=num_outputs, name=name)
