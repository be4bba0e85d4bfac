"""A scoring segment's 8-bit weight-only MatMuls on the kernel the engine runs them on.

A cpu engine runs its 8-bit weight-only layers as ``llmc::BlockInt8MatMul`` where the host has
the kernel (``llmc.plugins.int8_matmul``; the CPU lowering puts it in place of the
``MatMulNBits`` that ONNX Runtime fuses from ``DequantizeLinear`` + ``MatMul``). The search's
scorings run Q/DQ segments, which ONNX Runtime would fuse into its own ``MatMulNBits`` (the same
arithmetic to float32 rounding, at half the kernel's speed on a [256, 640] x [640, 262,144]
vocabulary projection). ``to_block_int8`` writes the op directly, in ``MatMulNBits``' weight
layout (what ONNX Runtime's fusion writes, checked by the tests), so a scoring computes what
the engine computes.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from llmc.engine.plugin import DOMAIN
from llmc.plugins.int8_matmul import OP_TYPE


def to_block_int8(model: onnx.ModelProto) -> int:
    """Replace, in place, each ``MatMul`` whose weight is a block-wise int8 ``DequantizeLinear``
    of initializers (codes [K, N] int8, scales [K / B, N] float32, axis 0, ``block_size`` B a
    multiple of 4 dividing K, no zero point) read by it alone, with ``llmc::BlockInt8MatMul``
    over the codes as ``MatMulNBits`` stores them (uint8 [N, K / B, B], the code + 128) and the
    scales [N * K / B]. Returns how many; the others are left to ONNX Runtime."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    uses = Counter(i for n in graph.node for i in n.input if i)
    uses.update(o.name for o in graph.output)
    dropped: list[onnx.NodeProto] = []
    for node in graph.node:
        dq = producer.get(node.input[1]) if node.op_type == "MatMul" else None
        weight = _block_weight(dq, inits) if dq is not None and uses[dq.output[0]] == 1 else None
        if weight is None:
            continue
        codes, scales, block = weight
        k, n = codes.shape
        name = dq.output[0]
        packed = (codes.T.astype(np.int16) + 128).astype(np.uint8).reshape(n, k // block, block)
        flat_scales = np.ascontiguousarray(scales.T).reshape(-1)
        graph.initializer.extend(
            [
                numpy_helper.from_array(packed, f"{name}.block_int8"),
                numpy_helper.from_array(flat_scales, f"{name}.scale"),
            ]
        )
        node.op_type, node.domain = OP_TYPE, DOMAIN
        node.input[1:] = [f"{name}.block_int8", f"{name}.scale"]
        node.attribute.extend(
            helper.make_attribute(key, value)
            for key, value in (("K", k), ("N", n), ("bits", 8), ("block_size", block))
        )
        dropped.append(dq)
    for dq in dropped:
        graph.node.remove(dq)
    if dropped:
        read = {i for n in graph.node for i in n.input}
        kept = [t for t in graph.initializer if t.name in read]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        if not any(o.domain == DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return len(dropped)


def _block_weight(dq: onnx.NodeProto, inits: dict) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(codes [K, N] int8, scales [K / B, N] float32, B) of a block-wise int8 weight
    ``DequantizeLinear`` the kernel takes, else None."""
    if dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx") or len(dq.input) != 2:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in dq.attribute}
    data, scale = (inits.get(name) for name in dq.input)
    block = attrs.get("block_size", 0)
    if data is None or scale is None or attrs.get("axis", 1) != 0 or block < 4 or block % 4:
        return None
    if data.data_type != onnx.TensorProto.INT8 or scale.data_type != onnx.TensorProto.FLOAT:
        return None
    if len(data.dims) != 2 or data.dims[0] % block:
        return None
    return numpy_helper.to_array(data), numpy_helper.to_array(scale), block
