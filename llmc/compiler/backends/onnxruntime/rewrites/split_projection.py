"""Split a large ``Gemm(x, W, transB=1)`` into row blocks of ``W``, so ONNX Runtime packs it a block
at a time when it loads the engine.

ONNX Runtime prepacks a GEMM's constant weight when a session loads: while it packs, the mapped
source and the packed copy are both resident, so a load peaks at the engine's bytes plus its
largest packed weight. For a tied float32 vocabulary projection that is the whole table: 1.58 GB
for Llama-3.2-3B's [128256, 3072] (a load measured at 14.50 GB peak, 12.93 GB after). Rows of a
``transB=1`` weight are contiguous bytes, so each block is an initializer over a range of the same
data (nothing is stored twice): k ``Gemm`` nodes read k blocks and a ``Concat`` joins their
outputs along the columns. Each output element is the same dot product as before.
"""

from __future__ import annotations

import math
from pathlib import Path

import onnx
from onnx import helper

from llmc.compiler.weights.shared_weights import ALIGNMENT, point_external

#: Largest block ONNX Runtime packs at once.
MAX_BLOCK_BYTES = 256 << 20


def _external(t: onnx.TensorProto) -> dict[str, str] | None:
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in t.external_data}


def _plain_transposed_gemm(node: onnx.NodeProto) -> bool:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return (
        node.op_type == "Gemm"
        and node.domain in ("", "ai.onnx")
        and len(node.input) == 2
        and attrs.get("transB") == 1
        and not attrs.get("transA", 0)
        and attrs.get("alpha", 1.0) == 1.0
    )


def split_projections(
    models: dict[Path, onnx.ModelProto], max_block_bytes: int = MAX_BLOCK_BYTES
) -> int:
    """Split, in place, every ``Gemm(x, W, transB=1)`` of ``models`` (saved segments, by path)
    whose float32 ``W`` is external data of more than ``max_block_bytes``; blocks start on
    ``ALIGNMENT`` boundaries of the data file (ONNX Runtime maps them). Saves each changed
    model. Returns how many weights were split."""
    count = 0
    for path, model in models.items():
        graph = model.graph
        inits = {t.name: t for t in graph.initializer}
        changed = False
        for position, node in reversed(list(enumerate(graph.node))):
            w = inits.get(node.input[1]) if len(node.input) > 1 else None
            if w is None or not _plain_transposed_gemm(node) or len(w.dims) != 2:
                continue
            info = _external(w)
            if info is None or w.data_type != onnx.TensorProto.FLOAT:
                continue
            rows, row_bytes = w.dims[0], 4 * w.dims[1]
            if rows * row_bytes <= max_block_bytes:
                continue
            align = ALIGNMENT // math.gcd(row_bytes, ALIGNMENT)  # rows per aligned step
            step = -(-max(1, max_block_bytes // row_bytes) // align) * align
            offset = int(info.get("offset", 0))
            outputs, nodes = [], []
            for i, start in enumerate(range(0, rows, step)):
                n = min(step, rows - start)
                block = onnx.TensorProto(name=f"{w.name}__rows{i}", data_type=w.data_type)
                block.dims.extend([n, w.dims[1]])
                point_external(block, info["location"], offset + start * row_bytes, n * row_bytes)
                graph.initializer.append(block)
                out = f"{node.output[0]}__rows{i}"
                nodes.append(helper.make_node("Gemm", [node.input[0], block.name], [out], transB=1))
                outputs.append(out)
            nodes.append(helper.make_node("Concat", outputs, [node.output[0]], axis=-1))
            del graph.node[position]
            for j, new in enumerate(nodes):
                new.name = f"{node.name or 'projection'}__rows{j}"
                graph.node.insert(position + j, new)
            if not any(w.name in n.input for n in graph.node):
                graph.initializer.remove(w)
            changed, count = True, count + 1
        if changed:
            onnx.save(model, str(path))
    return count
