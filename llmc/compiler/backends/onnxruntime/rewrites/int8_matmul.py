"""Run a cpu engine's 8-bit weight-only layers on llmc's int8 kernel: ``llmc::BlockInt8MatMul``
in place of ONNX Runtime's ``MatMulNBits`` (bits 8) in the engine's single graph.

The op takes MatMulNBits' inputs and attributes unchanged and computes what MatMulNBits computes
at accuracy level 4 (activations quantized to int8 per row and block, int32 dot products, block
scales), with micro-kernels that ORT's 8-bit kernel lacks (``llmc/plugins/int8_matmul``: AVX-512
VNNI and AMX tiles, AVX2 tiles, the same floats on each): on Gemma 3 270M's shapes, with VNNI
1.9x on its 18 layers at 128 rows and 1.6x on its vocabulary projection at 16 rows; on AVX2
(blocks of 32) about 2x at 16 and 128 rows and 1.3x at one row (benchmarks/RESULTS.md). Only
the single
graph is rewritten: the segments keep MatMulNBits, so OpenVINO's runtime (which knows
MatMulNBits, not llmc's op) can still compile them, and the segments form still runs without
the custom-op library. The two forms then agree to float32 rounding instead of bit for bit.

A gated MLP's down projection (``Split`` of the fused gate/up output, ``Gelu`` of the gate in
its tanh form, ``Mul`` by up) becomes one BlockInt8MatMul with ``input_gate="gelu_tanh"``, which
computes the product's input as it quantizes the rows: three ops and two [M, K] tensors less per
layer. Where the gate/up projection is a BlockInt8MatMul too (every layer 8-bit weight-only),
the gate goes into that node's output instead (``output_gate="gelu_tanh"``): it writes the
[M, K] product rather than [M, 2K] (Gemma 3 270M: 0.94x the 128-token prefill, bit for bit).
"""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import helper

from llmc.compiler.backends.onnxruntime.rewrites.node_attributes import attributes
from llmc.engine.plugin import DOMAIN
from llmc.plugins.int8_matmul import OP_TYPE

_KEPT_ATTRIBUTES = ("K", "N", "bits", "block_size")


def _eligible(node: onnx.NodeProto) -> bool:
    if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
        return False
    attrs = attributes(node)
    block = attrs.get("block_size", 0)
    return (
        attrs.get("bits", 4) == 8
        and not attrs.get("weight_prepacked", 0)
        and len(node.input) == 3  # no zero points, no group index, no bias
        and all(node.input)
        and block >= 4
        and block % 4 == 0
        and attrs.get("K", 0) % block == 0
    )


def rewrite_block_int8(model: onnx.ModelProto) -> int:
    """Replace, in place, every 8-bit ``MatMulNBits`` of ``model`` without zero points by
    ``llmc::BlockInt8MatMul`` (same inputs, outputs and K/N/bits/block_size attributes), then
    fold a GELU-gated input into it (``fuse_gelu_tanh_gates``). Returns how many nodes were
    replaced."""
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
    fuse_gelu_tanh_gates(model)
    return count


def _is_gelu_tanh(node: onnx.NodeProto | None) -> bool:
    if node is None:
        return False
    if node.op_type == "Gelu" and node.domain in ("", "ai.onnx"):
        return attributes(node).get("approximate") == b"tanh"
    return node.op_type == "FastGelu" and node.domain == "com.microsoft" and len(node.input) == 1


def _split_halves(node: onnx.NodeProto | None, k: int, inits: dict) -> bool:
    """Whether ``node`` splits its input's last axis into [k, k]."""
    if node is None or node.op_type != "Split" or len(node.output) != 2:
        return False
    attrs = attributes(node)
    if attrs.get("axis", 0) != -1:
        return False
    if len(node.input) > 1 and node.input[1] in inits:
        sizes = onnx.numpy_helper.to_array(inits[node.input[1]]).tolist()
    else:
        sizes = list(attrs.get("split", []))
    return sizes == [k, k]


def _gates_its_output(node: onnx.NodeProto | None, uses: int, k: int) -> bool:
    """Whether ``node`` is a BlockInt8MatMul producing [gate | up] of width 2k for the Split
    alone, which its output gate can fold (2k a multiple of 128: whole weight panels)."""
    if node is None or node.op_type != OP_TYPE or node.domain != DOMAIN or uses != 1:
        return False
    attrs = attributes(node)
    return "output_gate" not in attrs and attrs["N"] == 2 * k and attrs["N"] % 128 == 0


def fuse_gelu_tanh_gates(model: onnx.ModelProto) -> int:
    """Fold, in place, ``Split(x) -> (gate, up); Mul(Gelu_tanh(gate), up) -> BlockInt8MatMul``
    wherever every intermediate tensor has that one consumer: into the producer of ``x`` when
    it is a BlockInt8MatMul too (``output_gate="gelu_tanh"``: it writes the product, half its
    columns), else into the consumer (``BlockInt8MatMul(x, input_gate="gelu_tanh")``). Returns
    how many were folded."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    uses = Counter(i for n in graph.node for i in n.input if i)
    uses.update(o.name for o in graph.output)
    inits = {t.name: t for t in graph.initializer}
    dropped: set[int] = set()  # id() of the nodes folded away
    for node in graph.node:
        if node.op_type != OP_TYPE or node.domain != DOMAIN or "input_gate" in attributes(node):
            continue
        mul = producer.get(node.input[0])
        if mul is None or mul.op_type != "Mul" or uses[node.input[0]] != 1:
            continue
        for gelu_input, up in (mul.input, reversed(mul.input)):
            gelu = producer.get(gelu_input)
            split = producer.get(gelu.input[0]) if _is_gelu_tanh(gelu) else None
            if (
                _split_halves(split, attributes(node)["K"], inits)
                and list(split.output) == [gelu.input[0], up]
                and uses[gelu_input] == uses[gelu.input[0]] == uses[up] == 1
            ):
                gate_up = producer.get(split.input[0])
                if _gates_its_output(gate_up, uses[split.input[0]], attributes(node)["K"]):
                    gate_up.output[0] = mul.output[0]
                    gate_up.attribute.append(helper.make_attribute("output_gate", "gelu_tanh"))
                else:
                    node.input[0] = split.input[0]
                    node.attribute.append(helper.make_attribute("input_gate", "gelu_tanh"))
                dropped.update((id(mul), id(gelu), id(split)))
                break
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    return len(dropped) // 3
