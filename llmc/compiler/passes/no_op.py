"""Remove arithmetic no-ops: ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x`` (scalar constants).

transformers multiplies RoPE's cos/sin by ``attention_scaling`` (1.0 for default RoPE); the
no-op hides the RoPE pattern from the fusion and costs a pass over the tensor at run time.
"""

from __future__ import annotations

import onnx_ir as ir
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


RULES = pattern.RewriteRuleSet(
    [
        _no_op_rule("Mul", 1.0, False),
        _no_op_rule("Mul", 1.0, True),
        _no_op_rule("Add", 0.0, False),
        _no_op_rule("Add", 0.0, True),
    ]
)


def remove_no_ops(model: ir.Model) -> int:
    """Replace scalar identity arithmetic by its input; returns the number removed."""
    count = RULES.apply_to_model(model)
    if count:
        import onnx_ir.passes.common as common_passes

        common_passes.IdentityEliminationPass()(model)
    return count
