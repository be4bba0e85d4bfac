"""A quantized engine's embedding lookup reads the vocabulary projection's quantized table.

In a model with tied embeddings the first segment gathers rows of the float [V, H] table and
the last projects onto it. A quantized build gives the projection block-wise weights, which ONNX
Runtime fuses into ``MatMulNBits`` (B: [V, H / block, block * bits / 8] uint8, one scale per
row and block, zero point 2^(bits-1)); the float table then stays in the engine only for the
lookup: 671 MB of Gemma 3 270M's int4 engine. This pass replaces that ``Gather`` by ONNX
Runtime's ``GatherBlockQuantized`` over the same bytes (uint8 data [V, H * bits / 8], scales
[V, H / block], the same default zero point, low nibble first for 4 bits: the layouts agree
byte for byte when H is a multiple of the block), pointing at the projection's external data,
and drops the float table. The lookup then returns the dequantized rows, the values the
projection multiplies with; the accuracy report, measured after lowering, includes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo

from llmc.compiler.backends.onnxruntime.rewrites.node_attributes import attributes
from llmc.compiler.weights.shared_weights import point_external

#: Rows compared between the float table and the dequantized projection before rewriting.
CHECK_ROWS = 256


def _projections(last: onnx.ModelProto, vocab: int, hidden: int):
    """The ``MatMulNBits`` nodes of ``last`` that could project onto a [vocab, hidden] table
    (external B, no zero points), the last first: the vocabulary projection ends the graph."""
    inits = {t.name: t for t in last.graph.initializer}
    found = []
    for node in last.graph.node:
        if node.op_type != "MatMulNBits" or len([i for i in node.input if i]) != 3:
            continue
        a = attributes(node)
        b = inits.get(node.input[1])
        if (a.get("N"), a.get("K")) != (vocab, hidden) or hidden % a["block_size"] or b is None:
            continue
        if b.data_location == onnx.TensorProto.EXTERNAL and node.input[2] in inits:
            found.append((node, a, b, inits[node.input[2]]))
    return found[::-1]


def _dequantized_rows(q: np.ndarray, scales: np.ndarray, bits: int, block: int, rows) -> np.ndarray:
    """Rows of a [V, H * bits / 8] uint8 table with [V, H / block] scales, as float32."""
    q = q[rows]
    if bits == 4:  # low nibble first
        q = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(len(rows), -1)
    zero = 1 << (bits - 1)
    return (q.astype(np.float32) - zero) * np.repeat(scales[rows], block, axis=1)


def _same(candidate, table: onnx.TensorProto, paths: tuple[Path, Path]) -> bool:
    """Whether ``candidate`` (a ``_projections`` entry) quantizes ``table``: compared on
    ``CHECK_ROWS`` rows, in units of the quantization step."""
    _, a, b, scales = candidate
    vocab, hidden = table.dims
    bits, block = a["bits"], a["block_size"]
    b_info, t_info = ExternalDataInfo(b), ExternalDataInfo(table)
    if b_info.length != vocab * hidden * bits // 8:
        return False
    first_path, last_path = paths
    q = np.memmap(
        last_path.parent / b_info.location, np.uint8, "r", b_info.offset or 0, b_info.length
    )
    q = q.reshape(vocab, hidden * bits // 8)
    s = numpy_helper.to_array(scales, str(last_path.parent)).reshape(vocab, hidden // block)
    t = np.memmap(
        first_path.parent / t_info.location, np.float32, "r", t_info.offset or 0, vocab * hidden
    ).reshape(vocab, hidden)
    rows = np.linspace(0, vocab - 1, min(CHECK_ROWS, vocab)).astype(np.int64)
    step = np.maximum(np.repeat(s[rows], block, axis=1), 1e-12)
    error = np.abs(_dequantized_rows(q, s, bits, block, rows) - t[rows]) / step
    # GPTQ rounding moves values off nearest rounding, but stays within a few steps; an
    # unrelated table is off by about half its range (2^(bits-2) steps) on average.
    return error.mean() <= 1.0 and error.max() <= 8.0


def gather_from_projection(models: dict[Path, onnx.ModelProto]) -> int:
    """Rewrite the first segment's float embedding ``Gather`` as ``GatherBlockQuantized`` over
    the last segment's quantized projection when they hold the same table (compared on
    ``CHECK_ROWS`` rows: within a step on average, 8 at most); returns the bytes no
    longer stored (0 when nothing matched). ``models``: the saved segments by path, in plan
    order, loaded without their data; only the first one's proto changes
    (``shared_weights.compact_files`` then drops the float table from its file)."""
    first_path, last_path = list(models)[0], list(models)[-1]
    paths = (first_path, last_path)
    first, last = models[first_path], models[last_path]
    inits = {t.name: t for t in first.graph.initializer}
    for node in first.graph.node:
        table = inits.get(node.input[0]) if node.op_type == "Gather" else None
        if table is None or table.data_type != onnx.TensorProto.FLOAT or len(table.dims) != 2:
            continue
        if attributes(node).get("axis", 0) != 0 or table.data_location != onnx.TensorProto.EXTERNAL:
            continue
        match = next((c for c in _projections(last, *table.dims) if _same(c, table, paths)), None)
        if match is None:
            continue
        _, a, b, scales = match
        vocab, hidden = table.dims
        bits, block = a["bits"], a["block_size"]
        b_info, t_info = ExternalDataInfo(b), ExternalDataInfo(table)
        s = numpy_helper.to_array(scales, str(last_path.parent)).reshape(vocab, hidden // block)
        data = onnx.TensorProto(name=table.name + "_quantized", data_type=onnx.TensorProto.UINT8)
        data.dims.extend([vocab, hidden * bits // 8])
        point_external(data, b_info.location, b_info.offset or 0, b_info.length)
        scale = numpy_helper.from_array(s.astype(np.float32), table.name + "_scales")
        gather = helper.make_node(
            "GatherBlockQuantized",
            [data.name, node.input[1], scale.name],
            list(node.output),
            name=node.name,
            domain="com.microsoft",
            bits=bits,
            block_size=block,
            gather_axis=0,
            quantize_axis=1,
        )
        nodes = list(first.graph.node)
        nodes[nodes.index(node)] = gather
        del first.graph.node[:]
        first.graph.node.extend(nodes)
        first.graph.initializer.extend([data, scale])
        if not any(table.name in n.input for n in first.graph.node):
            first.graph.initializer.remove(table)
        if not any(o.domain == "com.microsoft" for o in first.opset_import):
            first.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        return t_info.length
    return 0
