"""TensorRT lint of the microscaling (NVFP4, MXFP8) nodes (see ``lint.py``): TensorRT's own
``trt``-domain ops and FP4 dequantization, in the form ``quantize.microscaling_graph`` writes.

Rules, from onnx/onnx-tensorrt ``builtin_op_importers.cpp`` and TensorRT's "DynamicQuantize"
operator reference:

- ``trt`` ops: only those onnx-tensorrt imports natively that llmc writes (``TRT_OPS``); any
  other would be looked up as a plugin, and none is registered;
- all of them, on Blackwell targets only (``BLOCK_SCALED_ARCHS``: FP4 and MX tensor cores).
  For FP4 this is the builder's own rule (TensorRT for RTX 1.7 at sm89: "Cannot compile for
  target(s) sm89, because the model contains HW-specific datatypes: fp4_e2m1"); for MXFP8 it is
  llmc's: the same builder builds an MXFP8 graph for sm89 (FP8 data runs there; no block-scaled
  tensor core applies the E8M0 scales, so nothing says it is faster than per-tensor fp8, which
  sm89 builds), and llmc keeps MXFP8 for the architectures whose tensor cores take it;
- ``TRT_FP4DynamicQuantize``: two inputs, the second (the double-quantization scale) a constant
  scalar > 0 ("Scale input must be an initializer", "must be a scalar"); ``block_size`` 16
  ("Only block_size == 16 is supported"); ``scale_type`` FP8 E4M3 ("scale_type must be FP8");
- ``TRT_MXFP8DynamicQuantize``: one input ("Single dynamic quantization requires 1 input");
  ``block_size`` 32 ("Only block_size 32 is supported");
- dynamic quantizers: ``axis`` the last or second-to-last ("The axis must be the last dimension
  or the second to last dimension"), written -1 or -2; a FLOAT, FLOAT16 or BFLOAT16 input;
- ``TRT_MXFP8DequantizeLinear``: FP8 E4M3 data; a uint8 scale (read as E8M0 by this op only):
  a constant, or a TRT_MXFP8DynamicQuantize's scale output; blocks of 32; a float
  ``output_dtype``;
- FP4 DequantizeLinear: block-wise in blocks of 16 (NVFP4); its scale may be computed (the
  two-level form, ``is_double_quant_scale``) where other Q/DQ scales are constants.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from llmc.compiler.backends.tensorrt.lint_view import node_finding
from llmc.compiler.quantize.microscaling_graph import (
    FP4_DYNAMIC_QUANTIZE,
    MXFP8_DEQUANTIZE,
    MXFP8_DYNAMIC_QUANTIZE,
    TRT_DOMAIN,
    TRT_OPS,
)
from llmc.engine.targets import TARGETS
from llmc.engine.targets.sm import SmTarget
from llmc.quant.microscaling import MXFP8_BLOCK, NVFP4_BLOCK

#: Targets with FP4 and MX block-scaled tensor cores (``targets.sm.SM_TABLE``).
BLOCK_SCALED_ARCHS = tuple(t.name for t in TARGETS.values() if isinstance(t, SmTarget) and t.fp4)
_BLOCKS = {
    FP4_DYNAMIC_QUANTIZE: NVFP4_BLOCK,
    MXFP8_DYNAMIC_QUANTIZE: MXFP8_BLOCK,
    MXFP8_DEQUANTIZE: MXFP8_BLOCK,
}
_FLOATS = ("FP32", "FP16", "BF16")


def check_microscaling(view, target: str | None) -> list:
    """Findings for the ``trt``-domain nodes and FP4 DequantizeLinear nodes of ``view`` (a
    ``GraphView``) on ``target`` (None: no per-arch check)."""
    out = []
    for n in view.model.graph.node:
        err = node_finding(n)
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.domain in ("", "ai.onnx"):
            if n.op_type == "DequantizeLinear" and view.type_name(n.input[0]) == "FP4":
                if attrs.get("block_size") != NVFP4_BLOCK:
                    out.append(err("microscaling", "FP4 data must be block-wise in blocks of 16"))
            continue
        if n.domain != TRT_DOMAIN:
            continue
        if n.op_type not in TRT_OPS:
            known = ", ".join(TRT_OPS)
            out.append(err("microscaling", f"no importer llmc knows of (known: {known})"))
            continue
        if target is not None and target not in BLOCK_SCALED_ARCHS:
            out.append(
                err(
                    "microscaling",
                    f"needs Blackwell's block-scaled tensor cores ({BLOCK_SCALED_ARCHS[0]} or "
                    f"newer); target is {target}",
                )
            )
        if attrs.get("block_size", _BLOCKS[n.op_type]) != _BLOCKS[n.op_type]:
            out.append(err("microscaling", f"block_size must be {_BLOCKS[n.op_type]}"))
        if n.op_type == MXFP8_DEQUANTIZE:
            out += _check_mxfp8_dequantize(view, n, attrs, err)
        else:
            out += _check_dynamic_quantize(view, n, attrs, err)
    return out


def _check_dynamic_quantize(view, n: onnx.NodeProto, attrs: dict, err) -> list:
    out = []
    inputs = 2 if n.op_type == FP4_DYNAMIC_QUANTIZE else 1
    if len(n.input) != inputs or len(n.output) != 2:
        out.append(err("microscaling", f"takes {inputs} input(s) and gives 2 outputs"))
        return out
    if attrs.get("axis") not in (-1, -2):
        out.append(
            err("microscaling", "axis must be -1 or -2 (TensorRT blocks one of the last two)")
        )
    if view.type_name(n.input[0]) not in (None, *_FLOATS):
        out.append(err("microscaling", f"input is {view.type_name(n.input[0])}, not a float"))
    if n.op_type == FP4_DYNAMIC_QUANTIZE:
        if attrs.get("scale_type", TensorProto.FLOAT8E4M3FN) != TensorProto.FLOAT8E4M3FN:
            out.append(err("microscaling", "scale_type must be FLOAT8E4M3FN"))
        scale = view.array(n.input[1]) if view.is_constant(n.input[1]) else None
        if scale is None or np.size(scale) != 1 or not float(np.ravel(scale)[0]) > 0:
            out.append(err("microscaling", f"scale {n.input[1]!r} must be a constant scalar > 0"))
    return out


def _check_mxfp8_dequantize(view, n: onnx.NodeProto, attrs: dict, err) -> list:
    out = []
    if len(n.input) != 2:
        return [err("microscaling", "takes 2 inputs: FP8 data and E8M0 scales")]
    if view.type_name(n.input[0]) not in (None, "FP8"):
        out.append(err("microscaling", f"data is {view.type_name(n.input[0])}, not FP8"))
    producer = view.producer.get(n.input[1])
    dynamic = producer is not None and producer.op_type == MXFP8_DYNAMIC_QUANTIZE
    if dynamic and producer.output[1] != n.input[1]:
        dynamic = False
    constant = view.is_constant(n.input[1]) and view.type_name(n.input[1]) == "UINT8"
    if not (dynamic or constant):
        out.append(
            err(
                "microscaling",
                f"scale {n.input[1]!r} must be uint8 E8M0 exponents: a constant or the scale "
                "output of TRT_MXFP8DynamicQuantize",
            )
        )
    to = attrs.get("output_dtype", TensorProto.FLOAT)
    if to not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16):
        out.append(err("microscaling", "output_dtype must be FLOAT, FLOAT16 or BFLOAT16"))
    return out


def is_double_quant_scale(view, n: onnx.NodeProto) -> bool:
    """Whether ``n``'s scale is NVFP4's computed one: ``n`` a block-wise DequantizeLinear of FP4
    data whose scale is the per-tensor DequantizeLinear of FP8 block scales (a constant, or
    TRT_FP4DynamicQuantize's scale output) by a constant scalar."""
    if view.type_name(n.input[0]) != "FP4" or len(n.input) < 2:
        return False
    inner = view.producer.get(n.input[1])
    if inner is None or inner.op_type != "DequantizeLinear" or len(inner.input) < 2:
        return False
    source = view.producer.get(inner.input[0])
    dynamic = source is not None and source.op_type == FP4_DYNAMIC_QUANTIZE
    if not (view.is_constant(inner.input[0]) or dynamic):
        return False
    g = view.array(inner.input[1]) if view.is_constant(inner.input[1]) else None
    return view.type_name(inner.input[0]) == "FP8" and g is not None and np.size(g) == 1


def type_standins(n: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Standard nodes giving ``n``'s outputs (a ``trt``-domain node) their element types, for
    type inference, which knows no ``trt`` schema (the scales' shapes are not modelled)."""
    x = n.input[0] if n.input else ""
    if n.op_type == FP4_DYNAMIC_QUANTIZE:
        types = [TensorProto.FLOAT4E2M1, TensorProto.FLOAT8E4M3FN]
    elif n.op_type == MXFP8_DYNAMIC_QUANTIZE:
        types = [TensorProto.FLOAT8E4M3FN, TensorProto.UINT8]
    elif n.op_type == MXFP8_DEQUANTIZE:
        to = next((a.i for a in n.attribute if a.name == "output_dtype"), TensorProto.FLOAT)
        types = [to]
    else:
        return []
    return [
        helper.make_node("Cast", [x], [o], f"{n.name}/type_{i}", to=t)
        for i, (o, t) in enumerate(zip(n.output, types, strict=False))
        if o and x
    ]
