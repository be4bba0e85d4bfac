"""TensorRT lint of Q/DQ nodes (see ``lint.py``).

Rules, from TensorRT's ONNX table (``QuantizeLinear``: "`y_zero_point` must be 0";
``DequantizeLinear``: INT8, FP8, FP4, INT4, "`x_zero_point` must be zero") and its quantization
guide ("Working with Quantized Types": INT8/FP8 activations per-tensor, weights per-tensor or
per-channel, INT4/FP4 weights block-wise and weight-only), and DESIGN §5 (FP8 needs sm89+,
NVFP4 sm100+):

- zero points, when present, are constants equal to 0 (symmetric), of a signed type;
- scales are constants, finite and > 0 (a float16 scale that underflowed is an error), of the
  quantized input's type (TensorRT's Quantize operator: input and scale are both T1); but for
  NVFP4's two-level dequantization (``lint_microscaling.is_double_quant_scale``);
- quantized types are INT8, FP8 E4M3FN, INT4 or FP4: no UINT8/UINT4 (asymmetric grids);
- activations (non-constant Q inputs) use one scale (per-tensor) and INT8 or FP8;
- INT4 is weight-only: a DequantizeLinear of a constant, block-wise with a block size of 64 or
  128 ("INT4 quantization requires per-block scales. The supported block sizes are {64, 128}",
  TensorRT "Quantization Schemes"), read as the B input of a MatMul/Gemm; no QuantizeLinear
  produces INT4;
- block-wise (de)quantization (a ``block_size`` attribute) only of FP4, FP8 and INT4 data:
  NVIDIA/TensorRT v11.1 ``include/NvInfer.h`` allows block quantization for those inputs only
  (``IDequantizeLayer``, as read). A Quantize operator table lists "kINT4, kFP4,
  kFP8 and kINT8"; the header is the stricter source, and the lint follows it. The GPU lowering
  turns llmc's block-wise INT8 weights into per-channel ones (``int8_weights.py``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from llmc.compiler.backends.tensorrt.lint_microscaling import is_double_quant_scale
from llmc.compiler.backends.tensorrt.lint_view import node_finding
from llmc.compiler.backends.tensorrt.support_table import TYPE_NAMES
from llmc.compiler.quantize.formats import int4
from llmc.engine.targets import TARGETS
from llmc.engine.targets.sm import SmTarget

_SM = [t for t in TARGETS.values() if isinstance(t, SmTarget)]
FP8_ARCHS = tuple(t.name for t in _SM if t.fp8)  # FP8 tensor cores (targets.sm.SM_TABLE)
FP4_ARCHS = tuple(t.name for t in _SM if t.fp4)
_Q_TYPES = {"INT8", "FP8", "INT4", "FP4"}
BLOCK_TYPES = ("INT4", "FP8", "FP4")
INT4_BLOCK_SIZES = int4.TRT_BLOCK_SIZES


def check_qdq(view, target: str | None) -> list:
    """Findings for every QuantizeLinear / DequantizeLinear node of ``view`` (a ``GraphView``)."""
    out = []
    for n in view.model.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or n.domain not in (
            "",
            "ai.onnx",
        ):
            continue
        err = node_finding(n)
        warn = node_finding(n, "warning")
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        qtype = _quantized_type(view, n, attrs)
        if qtype not in _Q_TYPES:
            out.append(
                err(
                    "qdq",
                    f"quantized type {qtype} is not one of INT8, FP8, INT4, FP4 (TensorRT "
                    "accepts signed, symmetric grids only)",
                )
            )
        out += _check_scale(view, n, err, warn)
        x, scale = view.type_name(n.input[0]), view.type_name(n.input[1])
        if n.op_type == "QuantizeLinear" and x and scale and x != scale:
            # TensorRT's Quantize operator: input and scale are both of type T1
            out.append(err("qdq", f"input is {x} but scale {n.input[1]!r} is {scale}"))
        out += _check_zero_point(view, n, err)
        # TensorRT for RTX 1.7's builder (tests/compiler/test_tensorrt_rtx.py): "Cannot compile
        # for target(s) sm86, because the model contains HW-specific datatypes: fp8_e4m3", and
        # "... sm89, because ... fp4_e2m1".
        arch_needed = {"FP8": FP8_ARCHS, "FP4": FP4_ARCHS}.get(qtype)
        if target is not None and arch_needed and target not in arch_needed:
            out.append(err("qdq", f"{qtype} needs {arch_needed[0]} or newer; target is {target}"))
        constant_input = view.is_constant(n.input[0])
        if n.op_type == "QuantizeLinear" and not constant_input:
            out += _check_activation(view, n, qtype, attrs, err)
        if qtype == "INT4":
            out += _check_int4(view, n, attrs, err)
        if attrs.get("block_size") and qtype not in BLOCK_TYPES:
            # NvInfer.h v11.1: block quantization takes FP4, FP8 and INT4 inputs only.
            out.append(
                err(
                    "block-dq",
                    f"block-wise (block_size {attrs['block_size']}) {qtype} data: TensorRT "
                    f"quantizes block-wise only {', '.join(BLOCK_TYPES)}; make it per-channel",
                )
            )
    return out


def _quantized_type(view, n: onnx.NodeProto, attrs: dict) -> str:
    """The integer/fp8 side's type: DQ's input, Q's zero point or ``output_dtype`` (default
    UINT8 in ONNX when neither is given)."""
    if n.op_type == "DequantizeLinear":
        return view.type_name(n.input[0]) or "unknown"
    if len(n.input) > 2 and n.input[2]:
        return view.type_name(n.input[2]) or "unknown"
    if attrs.get("output_dtype"):
        return _name_of(attrs["output_dtype"])
    return "UINT8"


def _name_of(elem_type: int) -> str:
    return TYPE_NAMES.get(elem_type, TensorProto.DataType.Name(elem_type))


def _check_scale(view, n, err, warn) -> list:
    name = n.input[1] if len(n.input) > 1 else ""
    if name and not view.is_constant(name) and is_double_quant_scale(view, n):
        return []  # its inner DequantizeLinear's scale is checked as any other
    if not name or not view.is_constant(name):
        return [err("qdq", f"scale {name!r} must be a constant initializer")]
    scale = view.array(name)
    if scale is None:
        return []
    s = np.asarray(scale, dtype=np.float32)
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        bad = int(np.sum(~np.isfinite(s) | (s <= 0)))
        return [
            err("qdq", f"scale {name!r} has {bad} values that are zero, negative or not finite")
        ]
    if scale.dtype == np.float16 and np.any(s < np.finfo(np.float16).tiny):
        return [warn("qdq", f"scale {name!r} has float16 subnormal values (precision lost)")]
    return []


def _check_zero_point(view, n, err) -> list:
    if len(n.input) < 3 or not n.input[2]:
        return []
    name = n.input[2]
    if not view.is_constant(name):
        return [err("qdq", f"zero point {name!r} must be a constant 0")]
    zp = view.array(name)
    if zp is not None and np.any(np.asarray(zp, dtype=np.float32) != 0):
        worst = float(np.max(np.abs(np.asarray(zp, dtype=np.float32))))
        return [
            err(
                "qdq",
                f"asymmetric: zero point {name!r} is nonzero (max |zp| = {worst:g}); "
                "TensorRT requires zero point 0",
            )
        ]
    return []


def _check_activation(view, n, qtype: str, attrs: dict, err) -> list:
    out = []
    scale = view.array(n.input[1]) if len(n.input) > 1 else None
    if scale is not None and np.asarray(scale).size != 1:
        out.append(
            err(
                "qdq",
                f"activation {n.input[0]!r} has {np.asarray(scale).size} scales; "
                "TensorRT quantizes activations per-tensor (one scale)",
            )
        )
    if attrs.get("block_size"):
        out.append(err("qdq", f"activation {n.input[0]!r} is block-wise; only weights may be"))
    if qtype == "INT4":
        out.append(err("int4", "INT4 is weight-only: activations are quantized to INT8 or FP8"))
    return out


def _check_int4(view, n, attrs: dict, err) -> list:
    if n.op_type == "QuantizeLinear":
        return []  # a constant Q to INT4 would be folded; activations are reported above
    out = []
    if not view.is_constant(n.input[0]):
        out.append(err("int4", f"INT4 data {n.input[0]!r} is not a constant weight (weight-only)"))
    block = attrs.get("block_size")
    if not block:
        out.append(
            err(
                "int4",
                "INT4 weights must be block-wise (DequantizeLinear block_size, "
                "opset 21); this one is per-tensor or per-channel",
            )
        )
    elif block not in INT4_BLOCK_SIZES:
        out.append(err("int4", f"INT4 block size {block}: TensorRT supports 64 and 128"))
    readers = view.consumers.get(n.output[0], [])
    bad = [c for c in readers if c.op_type not in ("MatMul", "Gemm") or c.input[1] != n.output[0]]
    if bad or not readers:
        what = ", ".join(f"{c.op_type} {c.name!r}" for c in bad) or "nothing"
        out.append(
            err("int4", f"INT4 weights must be the B input of a MatMul/Gemm; read by {what}")
        )
    return out
