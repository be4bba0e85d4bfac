"""Remove no-ops: ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x`` (scalar constants), and a
``Gather`` of index 0 along an axis of size 1 (a copy where a ``Squeeze`` does).

transformers multiplies RoPE's cos/sin by ``attention_scaling`` (1.0 for default RoPE); the
no-op hides the RoPE pattern from the fusion and costs a pass over the tensor at run time. The
exporter writes ``logits[0]`` (and ``squeeze``/``flatten`` of the batch dimension of 1) as a
``Gather``, which copies the whole [S, vocab] logits (16 MB at 16 decodes of Gemma 3's 262k
vocabulary, ~2 ms per step on 2 cores); ONNX Runtime runs ``Squeeze`` in place.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir import convenience
from onnxscript.rewriter import _ir_utils, pattern


def _no_op_rule(op_type: str, identity: float, constant_first: bool) -> pattern.RewriteRule:
    def target(op, x, c):
        return getattr(op, op_type)(c, x) if constant_first else getattr(op, op_type)(x, c)

    def replacement(op, x, c):
        return op.Identity(x)

    def condition(context, x, c, **_) -> bool:
        if not _ir_utils.is_singleton_value(c, identity, rtol=0.0):
            return False
        # Only a no-op when broadcasting cannot change x's shape: c is a scalar, or [1] against
        # an x of rank >= 1.
        if c.shape is None or c.shape.rank() > 1:
            return False
        return c.shape.rank() == 0 or (x.shape is not None and x.shape.rank() >= 1)

    return pattern.RewriteRule(target, replacement, condition)


def _selects_size_one_axis(x, index) -> bool:
    """Whether ``Gather(x, index, axis=0)`` only drops a leading axis of size 1."""
    if not _ir_utils.is_singleton_value(index, 0, rtol=0.0):
        return False
    shape = index.shape if index.const_value is None else index.const_value.shape
    if shape is None or shape.rank() != 0:  # a [1] index keeps the axis
        return False
    return x.shape is not None and x.shape.rank() >= 1 and x.shape[0] == 1


def _rank(value) -> int | None:
    """The rank of ``value``, looking through Transposes (the exporter leaves a tied vocabulary
    projection's weight as a Transpose of the embedding, with no shape recorded)."""
    if value.shape is not None:
        return value.shape.rank()
    if value.const_value is not None:
        return len(value.const_value.shape)
    producer = value.producer()
    if producer is not None and producer.op_type == "Transpose":
        return _rank(producer.inputs[0])
    return None


def _select_rule() -> pattern.RewriteRule:
    """``Gather(x, 0)`` on a leading axis of size 1 -> ``Squeeze(x)``."""

    def target(op, x, index):
        return op.Gather(x, index, axis=0)

    def replacement(op, x, index):
        return op.Squeeze(x, op.Constant(value_ints=[0]))

    def condition(context, x, index, **_) -> bool:
        return _selects_size_one_axis(x, index)

    return pattern.RewriteRule(target, replacement, condition)


def _squeeze_matmul_inputs(model: ir.Model) -> int:
    """``Gather(MatMul(a, w), 0)`` -> ``MatMul(Squeeze(a), w)``: the product is written in its
    final shape (ORT still copies a ``Squeeze`` whose output is a graph output: 1.9 ms for the
    logits, measured). The MatMul node itself is kept, with its name and metadata (the module
    name quantization matches ``--exclude`` against). Returns the number rewritten."""
    graph = model.graph
    count = 0
    for gather in list(graph):
        axis = gather.attributes.get("axis")
        if gather.op_type != "Gather" or gather.domain != "" or (axis and axis.as_int() != 0):
            continue
        product, index = gather.inputs
        matmul = product.producer()
        if matmul is None or matmul.op_type != "MatMul" or matmul.domain != "":
            continue
        if len(product.uses()) != 1 or product.is_graph_output():
            continue
        a, w = matmul.inputs
        if a.shape is None or a.shape.rank() != 3 or _rank(w) != 2:
            continue
        if not _selects_size_one_axis(a, index):
            continue
        axes = ir.node("Constant", [], attributes={"value_ints": [0]})
        squeeze = ir.node("Squeeze", [a, axes.outputs[0]])
        squeeze.outputs[0].shape = ir.Shape(list(a.shape)[1:])  # [1, S, K] -> [S, K]
        squeeze.outputs[0].type = a.type
        graph.insert_before(matmul, [axes, squeeze])
        matmul.replace_input_with(0, squeeze.outputs[0])
        convenience.replace_nodes_and_values(
            graph, matmul, [gather], [], [gather.outputs[0]], [product]
        )
        count += 1
    return count


RULES = pattern.RewriteRuleSet(
    [
        _select_rule(),
        _no_op_rule("Mul", 1.0, False),
        _no_op_rule("Mul", 1.0, True),
        _no_op_rule("Add", 0.0, False),
        _no_op_rule("Add", 0.0, True),
    ]
)


def remove_no_ops(model: ir.Model) -> int:
    """Replace scalar identity arithmetic by its input and size-1 selects by a Squeeze; returns
    the number of rewrites."""
    count = _squeeze_matmul_inputs(model) + RULES.apply_to_model(model)
    if count:
        import onnx_ir.passes.common as common_passes

        common_passes.IdentityEliminationPass()(model)
    return count
