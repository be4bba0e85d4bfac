"""Run a cpu engine's 8-bit weight-only layers on llmc's int8 kernel: ``llmc::BlockInt8MatMul``
in place of ONNX Runtime's ``MatMulNBits`` (bits 8) in the engine's single graph.

The op takes MatMulNBits' inputs and attributes unchanged and computes what MatMulNBits computes
at accuracy level 4 (activations quantized to int8 per row and block, int32 dot products, block
scales), with a VNNI micro-kernel that ORT's 8-bit kernel lacks at M > 1 (``llmc/plugins/
int8_matmul``): measured on Gemma 3 270M's shapes, 2.1x at a 128-row prefill ([2048, 640]),
1.5x for a 16-sequence decode's vocabulary projection (benchmarks/RESULTS.md). Only the single
graph is rewritten: the segments keep MatMulNBits, so OpenVINO's runtime (which knows
MatMulNBits, not llmc's op) can still compile them, and the segments form still runs without
the custom-op library. The two forms then agree to float32 rounding instead of bit for bit.
"""

from __future__ import annotations

import onnx
from onnx import helper

from llmc.engine.plugin import DOMAIN
from llmc.plugins.paged_attention import ort_op

OP_TYPE = "BlockInt8MatMul"
#: The ISA feature the kernel needs (``llmc.engine.isa`` names).
REQUIRED_ISA = "avx512-vnni"
_KEPT_ATTRIBUTES = ("K", "N", "bits", "block_size")


def block_int8_matmul_available(host_features: tuple[str, ...]) -> bool:
    """Whether engines built here can run BlockInt8MatMul: the host has AVX-512 VNNI and the
    custom-op library is built (``setup.py``)."""
    return REQUIRED_ISA in host_features and ort_op.library_path() is not None


def _eligible(node: onnx.NodeProto) -> bool:
    if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    block = attrs.get("block_size", 0)
    return (
        attrs.get("bits", 4) == 8
        and not attrs.get("weight_prepacked", 0)
        and len([i for i in node.input if i]) == 3
        and len(node.input) == 3
        and block >= 4
        and block % 4 == 0
        and attrs.get("K", 0) % block == 0
    )


def rewrite_block_int8(model: onnx.ModelProto) -> int:
    """Replace, in place, every 8-bit ``MatMulNBits`` of ``model`` without zero points by
    ``llmc::BlockInt8MatMul`` (same inputs, outputs and K/N/bits/block_size attributes).
    Returns how many nodes were replaced."""
    count = 0
    for node in model.graph.node:
        if not _eligible(node):
            continue
        kept = [a for a in node.attribute if a.name in _KEPT_ATTRIBUTES]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.op_type, node.domain = OP_TYPE, DOMAIN
        count += 1
    if count and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return count
