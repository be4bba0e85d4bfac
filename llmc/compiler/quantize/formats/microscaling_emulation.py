"""CPU lowering of NVFP4 and MXFP8 engines: their TensorRT graph (``microscaling_graph``) as
standard ops ONNX Runtime's CPU EP runs, computing the same numbers.

ONNX Runtime 1.31's CPU EP has no FP4 or MXFP8 GEMM, no Cast to FLOAT4E2M1 and no kernel of the
``trt`` domain (checked). So, as FP8 engines do (``formats.fp8.emulate_fp8_weights``):

- weights: each weight's dequantization is replaced by the float32 weight it produces, computed
  once at build time (NVFP4: E4M3 block scale x per-tensor scale, then x the E2M1 code);
- activations: each dynamic quantization and its dequantization become standard ops computing
  ``llmc.quant.microscaling.fake_quant_nvfp4`` / ``fake_quant_mxfp8`` bit for bit (correct, not
  fast): the input reshaped to [M, block] (blocks are contiguous along the last axis, whose
  length is a multiple of the block), each block's amax a ReduceMax of Abs; E4M3 rounding a
  QuantizeLinear to FLOAT8E4M3FN with scale 1 (saturating, round to nearest even: checked on
  ORT 1.31's CPU EP) and a DequantizeLinear (NVFP4's by the per-tensor scale: the graph's own
  inner DequantizeLinear); E2M1 rounding a Round (half to even, as E2M1's ties) of x / step, the
  grid's step being 0.5 below 2, 1 below 4 and 2 above, clipped to +-6; MXFP8's
  floor(log2(amax)) a Floor of Log(amax) / ln 2, made exact by comparing amax with the
  neighbouring powers of two (a Gather from a table of them: exact where Pow need not be).

ONNX Runtime merges the identical emulations of modules that read the same input (q/k/v,
gate/up: constant sharing, then common-subexpression elimination) up to their
QuantizeLinear nodes, which keep one per module since each has the module's own FP8 zero point,
as FP8's Q/DQ nodes do (checked). So an emulated module leaves one QuantizeLinear in the
optimized graph, the op the fast-path check counts (``cpu_kernel``), as for ``--quant fp8``.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.quantize.microscaling_graph import (
    FP4_DYNAMIC_QUANTIZE,
    MXFP8_DEQUANTIZE,
    MXFP8_DYNAMIC_QUANTIZE,
    TRT_DOMAIN,
)
from llmc.quant.microscaling import E4M3_EMAX, MXFP8_MIN_AMAX, TINY

#: The op each emulated module leaves in the optimized CPU graph (module docstring).
MARKER = "QuantizeLinear"
_CONST = "microscaling"  # prefix of the constants all emulations share
_POW2_MIN = -130  # the table of powers of two: 2^-130 .. 2^129 (inf above 2^127)
_POW2 = np.array(
    [math.ldexp(1.0, k) if k < 128 else math.inf for k in range(_POW2_MIN, 130)], np.float32
)


def emulate_nvfp4(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s NVFP4 weights and activations in place (module docstring); returns
    how many dequantizations were rewritten."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    weights = {}
    for node in g.node:
        if not _is_dq(node) or len(node.input) < 2 or node.input[1] not in producer:
            continue
        inner, data = producer[node.input[1]], inits.get(node.input[0])
        if data is None or data.data_type != TensorProto.FLOAT4E2M1:
            continue
        if not (_is_dq(inner) and all(i in inits for i in inner.input[:2])):
            continue
        axis, block = _block_attributes(node)
        weight = nvfp4_weight(
            _array(data), _array(inits[inner.input[0]]), _array(inits[inner.input[1]]), axis, block
        )
        weights[node.output[0]] = (weight, [node, inner])
    activations = {}
    for q in _trt_nodes(g, FP4_DYNAMIC_QUANTIZE):
        inner = _only_consumer(g, q.output[1])
        outer = _only_consumer(g, q.output[0])
        if inner is None or outer is None or outer.input[1] != inner.output[0]:
            continue
        activations[q.output[0]] = (
            _emulation(g, q, _nvfp4_activation, outer.output[0]),
            [inner, outer],
        )
    return _rewrite(model, weights, activations)


def emulate_mxfp8(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s MXFP8 weights and activations in place (module docstring); returns
    how many dequantizations were rewritten."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    weights = {}
    for node in _trt_nodes(g, MXFP8_DEQUANTIZE):
        if node.input[0] in inits and node.input[1] in inits:
            codes, exponents = _array(inits[node.input[0]]), _array(inits[node.input[1]])
            weights[node.output[0]] = (
                mxfp8_weight(codes, exponents, *_block_attributes(node)),
                [node],
            )
    activations = {}
    for q in _trt_nodes(g, MXFP8_DYNAMIC_QUANTIZE):
        dq = _only_consumer(g, q.output[0])
        if dq is None or dq.op_type != MXFP8_DEQUANTIZE or list(dq.input[:2]) != list(q.output):
            continue
        activations[q.output[0]] = (_emulation(g, q, _mxfp8_activation, dq.output[0]), [dq])
    return _rewrite(model, weights, activations)


def _nvfp4_activation(e: _Emitter, x: str, g: str) -> str:
    """fake_quant_nvfp4(x, g) of ``x`` [M, 16] (see ``llmc.quant.microscaling``)."""
    amax = e("ReduceMax", e("Abs", x), e.const("axis1", np.array([1], np.int64)), keepdims=1)
    s = e("Div", e("Div", amax, e.const("six", 6.0)), g)
    full = e("DequantizeLinear", e.fp8(s), g, e.fp8_zero())  # E4M3(s) x g
    y = e("Div", x, e("Max", full, e.const("tiny", TINY)))
    a = e("Abs", y)
    two, four = e.const("two", 2.0), e.const("four", 4.0)
    below4 = e("Where", e("Less", a, four), e.const("one", 1.0), two)
    step = e("Where", e("Less", a, two), e.const("half", 0.5), below4)
    q = e("Mul", e("Round", e("Div", y, step)), step)
    q = e("Clip", q, e.const("minus_six", -6.0), e.const("six", 6.0))
    return e("Mul", q, full)


def _mxfp8_activation(e: _Emitter, x: str) -> str:
    """fake_quant_mxfp8(x) of ``x`` [M, 32] (see ``llmc.quant.microscaling``)."""
    axis = e.const("axis1", np.array([1], np.int64))
    amax = e(
        "Max", e("ReduceMax", e("Abs", x), axis, keepdims=1), e.const("min_amax", MXFP8_MIN_AMAX)
    )
    log2 = e("Mul", e("Log", amax), e.const("inv_ln2", 1.0 / math.log(2.0)))
    # index in the table of 2^e0, e0 = floor(log2(amax)) up to Log's rounding: one either way
    i0 = e(
        "Add", e("Cast", e("Floor", log2), to=TensorProto.INT64), e.const("pow2_offset", -_POW2_MIN)
    )
    table = e.const("pow2", _POW2)
    too_high = e("Cast", e("Less", amax, e("Gather", table, i0)), to=TensorProto.INT64)
    next_pow2 = e("Gather", table, e("Add", i0, e.const("one_i", np.array(1, np.int64))))
    too_low = e("Cast", e("GreaterOrEqual", amax, next_pow2), to=TensorProto.INT64)
    exact = e("Sub", e("Add", i0, too_low), too_high)
    scale = e("Gather", table, e("Sub", exact, e.const("emax", np.array(E4M3_EMAX, np.int64))))
    q = e("DequantizeLinear", e.fp8(e("Div", x, scale)), e.const("one", 1.0), e.fp8_zero())
    return e("Mul", q, scale)


def _emulation(g: onnx.GraphProto, q: onnx.NodeProto, body, out: str) -> list[onnx.NodeProto]:
    """The standard-op nodes replacing dynamic quantization ``q`` and its dequantization, whose
    output ``out`` the last one writes: ``body`` (``_nvfp4_activation``, ``_mxfp8_activation``)
    sees the input as [M, block] blocks."""
    e = _Emitter(g, q.name or q.output[0])
    x, *rest = q.input
    block = next(a.i for a in q.attribute if a.name == "block_size")
    shape = e("Shape", x)
    blocks = e.const(f"blocks{block}", np.array([-1, block], np.int64))
    y = body(e, e("Reshape", x, blocks), *rest)
    e.nodes.append(helper.make_node("Reshape", [y, shape], [out], f"{e.prefix}/out"))
    return e.nodes


class _Emitter:
    """Makes one emulation's nodes (named after ``prefix``) and its constants."""

    def __init__(self, g: onnx.GraphProto, prefix: str) -> None:
        self.g, self.prefix = g, prefix
        self.nodes: list[onnx.NodeProto] = []
        self.names = {t.name for t in g.initializer}

    def __call__(self, op: str, *inputs: str, **attrs) -> str:
        out = f"{self.prefix}/{op}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], out, **attrs))
        return out

    def fp8(self, x: str) -> str:
        """E4M3 codes of ``x`` (round to nearest even, saturating): QuantizeLinear, scale 1."""
        return self("QuantizeLinear", x, self.const("one", 1.0), self.fp8_zero(), saturate=1)

    def fp8_zero(self) -> str:
        """The module's own FP8 zero point (as FP8 Q/DQ nodes have theirs): ONNX Runtime shares
        no FP8 constants between modules, so it merges none of their Q/DQ nodes."""
        zero = np.zeros((), ml_dtypes.float8_e4m3fn)
        return self.initializer(f"{self.prefix}.fp8_zero", zero)

    def const(self, name: str, value) -> str:
        """A constant all emulations share (Python floats as float32)."""
        array = np.asarray(value, np.float32 if isinstance(value, float) else None)
        return self.initializer(f"{_CONST}.{name}", array)

    def initializer(self, name: str, array: np.ndarray) -> str:
        if name not in self.names:
            self.g.initializer.append(numpy_helper.from_array(array, name))
            self.names.add(name)
        return name


def _rewrite(model: onnx.ModelProto, weights: dict, activations: dict) -> int:
    """Replace each weight's DQ nodes by its float32 initializer (``weights``: {output:
    (array, nodes)}), and each dynamic quantization node and its DQ nodes by their emulation
    (``activations``: {its first output: (emulation nodes, DQ nodes)}); drop what nothing
    reads. Nodes are told apart by their first output (unique in a graph)."""
    g = model.graph
    removed = {n.output[0] for _, nodes in weights.values() for n in nodes}
    removed |= {n.output[0] for _, nodes in activations.values() for n in nodes}
    kept = []
    for node in g.node:
        if node.output[0] in activations:
            kept.extend(activations[node.output[0]][0])
        elif node.output[0] not in removed:
            kept.append(node)
    del g.node[:]
    g.node.extend(kept)
    for name, (array, _) in weights.items():
        g.initializer.append(numpy_helper.from_array(array, name))
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    values = used | {o for n in g.node for o in n.output}
    infos = [vi for vi in g.value_info if vi.name in values]
    del g.value_info[:]
    g.value_info.extend(infos)
    if not any(n.domain == TRT_DOMAIN for n in g.node):
        opsets = [o for o in model.opset_import if o.domain != TRT_DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(opsets)
    return len(weights) + len(activations)


def nvfp4_weight(
    codes: np.ndarray, block_scale: np.ndarray, global_scale, axis: int, block: int
) -> np.ndarray:
    """The float32 weight NVFP4's two DequantizeLinear nodes give: the E4M3 ``block_scale``
    x the per-tensor ``global_scale`` (float32), then the E2M1 ``codes`` x that per block."""
    full = block_scale.astype(np.float32) * np.asarray(global_scale, np.float32)
    return _blockwise(codes, full, axis, block)


def mxfp8_weight(codes: np.ndarray, exponents: np.ndarray, axis: int, block: int) -> np.ndarray:
    """The float32 weight MXFP8's dequantization gives: the E4M3 ``codes`` x 2^(E8M0 - 127)
    per block."""
    scale = np.ldexp(np.float32(1.0), exponents.astype(np.int32) - 127).astype(np.float32)
    return _blockwise(codes, scale, axis, block)


def _block_attributes(dq: onnx.NodeProto) -> tuple[int, int]:
    """(axis, block_size) of block-wise DequantizeLinear ``dq``."""
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    return axis, next(a.i for a in dq.attribute if a.name == "block_size")


def _blockwise(codes: np.ndarray, scale: np.ndarray, axis: int, block: int) -> np.ndarray:
    """What a block-wise DequantizeLinear gives for ``codes`` and float32 ``scale``."""
    full = np.repeat(scale, block, axis=axis)
    return (codes.astype(np.float32) * full).astype(np.float32)


def _array(t: onnx.TensorProto) -> np.ndarray:
    return numpy_helper.to_array(t)


def _is_dq(n: onnx.NodeProto) -> bool:
    return n.op_type == "DequantizeLinear" and n.domain in ("", "ai.onnx")


def _trt_nodes(g: onnx.GraphProto, op: str) -> list[onnx.NodeProto]:
    return [n for n in g.node if n.domain == TRT_DOMAIN and n.op_type == op]


def _only_consumer(g: onnx.GraphProto, name: str) -> onnx.NodeProto | None:
    readers = [n for n in g.node if name in n.input]
    return readers[0] if len(readers) == 1 else None
