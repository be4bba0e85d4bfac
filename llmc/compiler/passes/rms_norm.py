"""Fuse the RMSNorm subgraph into ONNX ``RMSNormalization`` (opset 23).

RMSNorm (Zhang & Sennrich, 2019): ``y = x / sqrt(mean(x^2, -1) + eps) * w``. transformers writes
it as Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul (Gemma's ``1 + w`` is a folded constant).
One fused node is faster on ONNX Runtime and maps to one TensorRT normalization layer.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import _ir_utils, pattern


class RmsNormFusion(pattern.RewriteRuleClassBase):
    """Pattern, check, rewrite for ``Mul(Mul(x, Reciprocal(Sqrt(mean(x^2) + eps))), w)``."""

    def pattern(self, op, x, eps, weight):
        mean_sq = op.ReduceMean(op.Pow(x, 2.0), [-1], keepdims=1, noop_with_empty_axes=0)
        normed = op.Mul(x, op.Reciprocal(op.Sqrt(op.Add(mean_sq, eps))))
        return op.Mul(normed, weight)

    def check(self, context, x, eps, weight, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if not isinstance(_ir_utils.get_singleton_value(eps), float):
            return result.fail("epsilon is not a float scalar constant", eps)
        if weight.const_value is None:
            return result.fail("weight is not a constant", weight)
        if x.shape is None or weight.shape is None or len(weight.shape) != 1:
            return result.fail("weight is not a vector over the last axis", weight)
        if x.shape[-1] != weight.shape[0]:
            return result.fail("weight length differs from the normalized axis", weight)
        if x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
            return result.fail("input is not a floating-point tensor", x)
        return result

    def rewrite(self, op, x, eps, weight, **_):
        epsilon = _ir_utils.get_singleton_value(eps)
        return op.RMSNormalization(x, weight, axis=-1, epsilon=epsilon, stash_type=1)


# commute: Llama writes w * normed, Gemma normed * (1 + w); both orders match.
RULES = pattern.RewriteRuleSet([RmsNormFusion.rule()], commute=True)


def fuse_rms_norm(model: ir.Model) -> int:
    """Rewrite every RMSNorm subgraph in ``model`` in place; returns the number fused."""
    return RULES.apply_to_model(model)
