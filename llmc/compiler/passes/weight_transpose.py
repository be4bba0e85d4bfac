"""Fold ``Transpose`` of a weight into a weight stored transposed, without reading it.

The exporter writes ``nn.Linear`` as ``MatMul(x, Transpose(W))``. Constant folding would read
every weight and hold its transposed copy in memory, the whole model at once; this pass
replaces each such pair by one initializer whose values are transposed when it is written
(``onnx_ir.LazyTensor``), so a streaming build reads one weight at a time
(``llmc.compiler.weights.checkpoint_weights``). The graph is the one constant folding gives.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

#: Metadata key on a transposed initializer: the name of the weight it transposes.
TRANSPOSED_FROM = "llmc.transposed_from"
#: ``meta`` key of a transposed tensor: (the tensor it transposes, the permutation).
TRANSPOSED_SOURCE = "llmc.transposed_source"


def _transposed(src: ir.TensorProtocol, perm: list[int], name: str) -> ir.TensorProtocol:
    shape = ir.Shape([src.shape[p] for p in perm])

    def read() -> ir.TensorProtocol:
        return ir.tensor(np.ascontiguousarray(np.transpose(src.numpy(), perm)), name=name)

    tensor = ir.LazyTensor(read, dtype=src.dtype, shape=shape, name=name)
    tensor.meta[TRANSPOSED_SOURCE] = (src, tuple(perm))  # for stored_weights
    return tensor


def fold_weight_transposes(model: ir.Model) -> int:
    """Replace ``Transpose(initializer)`` by a transposed initializer; returns how many."""
    graph = model.graph
    count = 0
    for node in list(graph):
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
            continue
        weight = node.inputs[0]
        if weight is None or weight.const_value is None or not weight.is_initializer():
            continue
        rank = len(weight.const_value.shape)
        perm = node.attributes.get_ints("perm", list(reversed(range(rank))))
        out = node.outputs[0]
        name = f"{weight.name}_transposed"
        value = ir.Value(name=name, const_value=_transposed(weight.const_value, list(perm), name))
        value.shape, value.type = value.const_value.shape, ir.TensorType(weight.const_value.dtype)
        value.metadata_props[TRANSPOSED_FROM] = weight.name  # for passes/tied_weights.py
        graph.register_initializer(value)
        ir.convenience.replace_all_uses_with(out, value)
        graph.remove(node, safe=True)
        count += 1
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_output():
            del graph.initializers[name]
    return count
