"""Block-wise INT8 weights become per-channel INT8 weights on TensorRT targets.

The CPU engine keeps 8-bit weight-only layers (by default the vocabulary projection of every
``--quant``, and int4's ``*.down_proj``) as block-wise INT8 DequantizeLinear, which ONNX Runtime
runs as ``MatMulNBits``. TensorRT's block dequantization takes FP4, FP8 and INT4 inputs only
(NVIDIA/TensorRT v11.1 ``include/NvInfer.h``, ``IDequantizeLayer``, as read), so the
GPU lowering rewrites those weights to per-channel INT8 (one scale per output channel, axis 1:
not block quantization), which TensorRT dequantizes like any per-channel weight.

Why per-channel INT8 and not the other formats TensorRT allows: FP8 E4M3 weights (3 mantissa
bits) and 4-bit blocks of a 262,144-row vocabulary projection flip Gemma 3's argmax (the
measurements in ``llmc.compiler.quantize.formats``), while per-channel INT8 keeps 8 bits and the
same memory as the block-wise weights. The codes are re-chosen from the block-wise weights
(the float weights are gone by now): ``w = q * s_block``, ``s_n = max_k |w[k, n]| / 127``,
``q' = round_half_even(w / s_n)``; the error this adds is at most ``s_n / 2`` per weight, the
rounding step of a per-channel grid.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.weights.lazy_weights import read_array
from llmc.quant.grids import INT8

_TINY = np.float32(1e-12)


def blockwise_int8_to_per_channel(model: onnx.ModelProto) -> int:
    """Rewrite every DequantizeLinear of a constant 2-D block-wise INT8 weight (read by that
    node only) into a per-channel one, in place. Returns how many were rewritten; others are
    left for the lint to report."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    uses = Counter(i for n in g.node for i in n.input)
    rewritten = 0
    for n in g.node:
        if n.op_type != "DequantizeLinear" or n.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        block = attrs.get("block_size", 0)
        data, scale = inits.get(n.input[0]), inits.get(n.input[1])
        has_zero_point = len(n.input) > 2 and n.input[2]
        if not block or data is None or scale is None or has_zero_point:
            continue
        if data.data_type != TensorProto.INT8 or len(data.dims) != 2:
            continue
        if uses[data.name] != 1 or uses[scale.name] != 1:
            continue
        axis = attrs.get("axis", 1) % 2
        q, s = _per_channel(numpy_helper.to_array(data), numpy_helper.to_array(scale), block, axis)
        data.CopyFrom(numpy_helper.from_array(q, data.name))
        scale.CopyFrom(numpy_helper.from_array(s, scale.name))
        del n.attribute[:]
        n.attribute.append(helper.make_attribute("axis", 1 - axis))
        rewritten += 1
    return rewritten


def lazy_blockwise_int8_to_per_channel(model: ir.Model) -> int:
    """``blockwise_int8_to_per_channel`` of an ``onnx_ir`` model whose weights are not read
    (a streamed build): the same nodes are rewritten, and each new weight and scale is an
    ``onnx_ir.LazyTensor`` over the block-wise source tensors, computed when the model is saved
    (one weight at a time). Returns how many were rewritten."""
    rewritten = 0
    for n in model.graph:
        if n.op_type != "DequantizeLinear" or n.domain not in ("", "ai.onnx"):
            continue
        block = n.attributes.get_int("block_size", 0)
        data, scale = n.inputs[0], n.inputs[1] if len(n.inputs) > 1 else None
        has_zero_point = len(n.inputs) > 2 and n.inputs[2] is not None
        if not block or has_zero_point or not _constant(data) or not _constant(scale):
            continue
        q, s = data.const_value, scale.const_value
        if q.dtype != ir.DataType.INT8 or len(q.shape) != 2:
            continue
        if len(data.uses()) != 1 or len(scale.uses()) != 1:
            continue
        axis = n.attributes.get_int("axis", 1) % 2

        def convert(q=q, s=s, axis=axis, block=block) -> tuple[np.ndarray, np.ndarray]:
            return _per_channel(read_array(q), read_array(s), block, axis)

        codes, scales = _lazy_pair(convert, data.name, scale.name, q.shape, q.shape[1 - axis])
        data.const_value, scale.const_value = codes, scales
        scale.shape = scales.shape
        n.attributes.clear()
        n.attributes["axis"] = ir.AttrInt64("axis", 1 - axis)
        rewritten += 1
    return rewritten


def _constant(v: ir.Value | None) -> bool:
    return v is not None and v.is_initializer() and v.const_value is not None


def _lazy_pair(convert, codes_name: str, scale_name: str, shape: ir.Shape, channels: int):
    """The codes [K, N] INT8 and per-channel scales [channels] FLOAT of ``convert()``, as two
    LazyTensors; each computes ``convert`` when written (twice in all: holding the codes
    until the scales are written would keep a whole weight in memory)."""

    def codes() -> ir.TensorProtocol:
        return ir.tensor(convert()[0], name=codes_name)

    def scales() -> ir.TensorProtocol:
        return ir.tensor(convert()[1], name=scale_name)

    return (
        ir.LazyTensor(codes, dtype=ir.DataType.INT8, shape=shape, name=codes_name),
        ir.LazyTensor(scales, dtype=ir.DataType.FLOAT, shape=ir.Shape([channels]), name=scale_name),
    )


def _per_channel(
    q: np.ndarray, block_scale: np.ndarray, block: int, axis: int, chunk: int = 4096
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel INT8 codes and scales (along ``1 - axis``) of the block-wise weight ``q``
    [K, N] with ``block_scale`` [ceil(K / block), N] along ``axis`` (0 for llmc's weights).
    Computed ``chunk`` channels at a time (each channel alone, so the result is the same):
    float32 copies of a 151,936-row vocabulary projection would take GBs."""
    codes = np.empty(q.shape, np.int8)
    scales = np.empty(q.shape[1 - axis], np.float32)
    for start in range(0, q.shape[1 - axis], chunk):
        part = slice(start, start + chunk)
        at = (slice(None), part) if axis == 0 else (part, slice(None))
        scale = np.repeat(block_scale[at].astype(np.float32), block, axis=axis)
        w = q[at].astype(np.float32) * np.take(scale, np.arange(q.shape[axis]), axis=axis)
        per_channel = np.maximum(np.abs(w).max(axis=axis), _TINY) / INT8.qmax
        codes[at] = INT8.to_codes(w / np.expand_dims(per_channel, axis))
        scales[part] = per_channel
    return codes, scales
