"""Which graphs ONNX Runtime must run with packed weights: the rule ``LayerwiseRunner`` uses to
give a segment's session packed copies of its weights only where a kernel needs them."""

from __future__ import annotations

#: Ops whose kernels read packed weights (MatMulNBits computes at its accuracy level only from
#: them; Q/DQ MatMuls of integer types fuse into such kernels under ``engine_kernels``).
QUANTIZED_OPS = frozenset({"DequantizeLinear", "QuantizeLinear", "MatMulNBits", "MatMulInteger"})
#: Q/DQ ops, which fuse into packed-weight kernels only when their quantized side is an integer.
QDQ_OPS = frozenset({"DequantizeLinear", "QuantizeLinear"})
#: ``onnx.TensorProto`` names of the FP8 and FP4 types.
FLOAT_QUANT_TYPES = frozenset(
    {"FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT4E2M1"}
)


def needs_packed_weights(segment) -> bool:
    """Whether ONNX Runtime runs some node of ``segment`` (an ``onnx.ModelProto``) on a kernel
    that computes from packed weights: an op of ``QUANTIZED_OPS`` other than Q/DQ, or a Q/DQ
    whose quantized side (its zero point, else a DequantizeLinear's constant input; uint8 for
    a QuantizeLinear with neither) is an integer type, which ORT's QDQ fusions turn into such
    kernels (MatMulNBits, MatMulIntegerToFloat). FP8 and FP4 Q/DQ (the CPU emulation of those
    formats) run float MatMuls, which need no packed copy."""
    import onnx

    floats = {getattr(onnx.TensorProto, name) for name in FLOAT_QUANT_TYPES}
    types = {t.name: t.data_type for t in segment.graph.initializer}
    for node in segment.graph.node:
        if node.op_type not in QUANTIZED_OPS:
            continue
        if node.op_type not in QDQ_OPS:
            return True
        zero_point = node.input[2] if len(node.input) > 2 and node.input[2] else None
        side = zero_point or (node.input[0] if node.op_type == "DequantizeLinear" else None)
        code = types.get(side) if side is not None else onnx.TensorProto.UINT8
        if code not in floats:
            return True  # an integer, or a type not known here: keep the packed kernels
    return False
