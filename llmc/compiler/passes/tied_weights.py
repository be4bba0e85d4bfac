"""Store a tied embedding once: the vocabulary projection reads the embedding table itself.

A model with tied embeddings (Gemma, Qwen2.5-0.5B, Llama 3.2) uses one [V, H] table twice:
``Gather`` rows for the input embedding, and ``x @ table^T`` for the logits. Folding the
transpose (``weight_transpose.py``) would store a second, transposed table: 262,144 x 640
float32 (671 MB) for Gemma 3 270M. This pass turns ``MatMul(x, table^T)`` with a 2-D ``x``
into ``Gemm(x, table, transB=1)`` (standard ONNX, which ONNX Runtime's CPU GEMM and TensorRT run
with the transpose folded into the kernel) and drops the transposed copy, so the graph holds
the table once. ``llmc.compiler.weights.shared_weights`` then keeps the engine's segments from
storing
it twice.
"""

from __future__ import annotations

import onnx_ir as ir

from llmc.compiler.passes.weight_transpose import TRANSPOSED_FROM


def _rank(value: ir.Value) -> int | None:
    return None if value.shape is None else len(value.shape)


def use_tied_weights(model: ir.Model) -> int:
    """Rewrite each ``MatMul(x [M, K], transpose(W) [K, N])`` whose ``W`` [N, K] is still an
    initializer of the graph (read elsewhere) into ``Gemm(x, W, transB=1)``; returns how
    many."""
    graph = model.graph
    count = 0
    for node in list(graph):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        x, w_t = node.inputs
        source = (
            graph.initializers.get(w_t.metadata_props.get(TRANSPOSED_FROM, "")) if w_t else None
        )
        if source is None or not source.uses() or _rank(x) != 2 or len(w_t.shape) != 2:
            continue
        gemm = ir.node("Gemm", [x, source], {"transB": 1}, name=node.name)
        gemm.metadata_props.update(node.metadata_props)  # module names: --exclude reads them
        gemm.outputs[0].shape, gemm.outputs[0].type = node.outputs[0].shape, node.outputs[0].type
        graph.insert_before(node, gemm)
        out = node.outputs[0]
        ir.convenience.replace_all_uses_with(out, gemm.outputs[0], replace_graph_outputs=True)
        graph.remove(node, safe=True)
        gemm.outputs[0].name = out.name
        if not w_t.uses():
            del graph.initializers[w_t.name]
        count += 1
    return count
