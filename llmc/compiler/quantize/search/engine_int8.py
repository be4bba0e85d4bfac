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

import numpy as np
import onnx_ir as ir

from llmc.engine.plugin import DOMAIN
from llmc.plugins.int8_matmul import OP_TYPE

#: Output channels laid out at a time (bounds the transposition's temporaries).
COLUMNS = 16384


def to_block_int8(model: ir.Model) -> int:
    """Replace, in place, each ``MatMul`` whose weight is a block-wise int8 ``DequantizeLinear``
    of constants (codes [K, N] int8, scales [K / B, N] float32, axis 0, ``block_size`` B a
    multiple of 4 dividing K, no zero point) read by it alone, with ``llmc::BlockInt8MatMul``
    over the codes as ``MatMulNBits`` stores them (uint8 [N, K / B, B], the code + 128) and the
    scales [N * K / B]; the ``DequantizeLinear`` goes (its constants stay for ``drop_dead``).
    Returns how many; the others are left to ONNX Runtime."""
    count = 0
    for node in list(model.graph):
        weight = _block_weight(node)
        if weight is None:
            continue
        dq = node.inputs[1].producer()
        codes, scales, block = weight
        k, n = codes.shape
        name = node.inputs[1].name or f"{node.name}.weight"
        packed = ir.Value(name=f"{name}.block_int8", const_value=ir.tensor(_packed(codes, block)))
        flat = np.ascontiguousarray(scales.T).reshape(-1)
        scale = ir.Value(name=f"{name}.block_scale", const_value=ir.tensor(flat))
        for value in (packed, scale):
            model.graph.register_initializer(value)
        node.op_type, node.domain = OP_TYPE, DOMAIN
        node.resize_inputs(3)
        node.replace_input_with(1, packed)
        node.replace_input_with(2, scale)
        for key, value in (("K", k), ("N", n), ("bits", 8), ("block_size", block)):
            node.attributes[key] = ir.AttrInt64(key, value)
        model.graph.remove(dq, safe=True)
        count += 1
    if count:
        model.opset_imports.setdefault(DOMAIN, 1)
    return count


def _block_weight(node: ir.Node) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(codes [K, N] int8, scales [K / B, N] float32, B) of ``node``'s weight where ``node`` is a
    MatMul of a block-wise int8 weight ``DequantizeLinear`` the kernel takes, else None."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    weight = node.inputs[1]
    dq = weight.producer() if weight is not None else None
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx"):
        return None
    if len(dq.inputs) != 2 or len(weight.uses()) != 1 or weight.is_graph_output():
        return None
    data, scale = (v.const_value if v is not None else None for v in dq.inputs)
    axis, block = dq.attributes.get_int("axis", 1), dq.attributes.get_int("block_size", 0)
    if data is None or scale is None or axis != 0 or block < 4 or block % 4:
        return None
    if data.dtype != ir.DataType.INT8 or scale.dtype != ir.DataType.FLOAT:
        return None
    if len(data.shape) != 2 or data.shape[0] % block:
        return None
    return data.numpy(), scale.numpy(), block


def _packed(codes: np.ndarray, block: int) -> np.ndarray:
    """uint8 [N, K / block, block]: ``codes`` [K, N] int8 transposed, each + 128 (its bits with
    the sign bit flipped), written ``COLUMNS`` output channels at a time."""
    k, n = codes.shape
    out = np.empty((n, k), np.uint8)
    bits = codes.view(np.uint8)
    for c in range(0, n, COLUMNS):
        np.bitwise_xor(bits[:, c : c + COLUMNS].T, 0x80, out=out[c : c + COLUMNS])
    return out.reshape(n, k // block, block)
