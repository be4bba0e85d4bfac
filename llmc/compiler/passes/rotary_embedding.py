"""Fuse rotary position embedding into ONNX ``RotaryEmbedding`` (opset 23).

RoPE (Su et al., 2021, "RoFormer"), in transformers' non-interleaved form:
``x * cos + rotate_half(x) * sin`` with ``cos = Cos(Concat(freqs, freqs))``, ``rotate_half(x) =
Concat(-x[..., D/2:], x[..., :D/2])``. The fused op takes the half-width cos/sin directly.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import _ir_utils, pattern


class RotaryEmbeddingFusion(pattern.RewriteRuleClassBase):
    """x [B, H, S, D] rotated by ``freqs`` [B, S, D/2] (angles = position * inv_freq)."""

    def __init__(self):
        # The cos/sin nodes are shared by every layer: keep them, let dead-code removal decide.
        super().__init__(name="RotaryEmbeddingFusion", remove_nodes=False)

    def pattern(self, op, x, freqs, axes_cos, axes_sin, lo_start, lo_end, hi_start, hi_end):
        doubled = op.Concat(freqs, freqs, axis=-1)
        cos = op.Unsqueeze(op.Cos(doubled), axes_cos)
        sin = op.Unsqueeze(op.Sin(doubled), axes_sin)
        low = op.Slice(x, lo_start, lo_end, [3], [1])
        high = op.Slice(x, hi_start, hi_end, [3], [1])
        rotated = op.Concat(op.Neg(high), low, axis=-1)
        return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

    def check(
        self, context, x, axes_cos, axes_sin, lo_start, lo_end, hi_start, hi_end, **_
    ) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if x.shape is None or len(x.shape) != 4 or not isinstance(x.shape[3], int):
            return result.fail("x is not [B, H, S, D] with a static head size", x)
        if not isinstance(x.shape[1], int):
            return result.fail("the number of heads is not static", x)
        for axes in (axes_cos, axes_sin):
            if not _ir_utils.is_singleton_value(axes, 1):
                return result.fail("cos/sin are not unsqueezed on the head axis", axes)
        half = x.shape[3] // 2
        if not (
            _ir_utils.is_singleton_value(lo_start, 0)
            and _ir_utils.is_singleton_value(lo_end, half)
            and _ir_utils.is_singleton_value(hi_start, half)
            and _ir_utils.is_singleton_value(hi_end, lambda v: v >= 2 * half)
        ):
            return result.fail("x is not split into two halves of the head dimension")
        return result

    def rewrite(self, op, x, freqs, **_):
        return op.RotaryEmbedding(
            x, op.Cos(freqs), op.Sin(freqs), interleaved=0, num_heads=x.shape[1]
        )


RULES = pattern.RewriteRuleSet([RotaryEmbeddingFusion.rule()])


def fuse_rotary_embedding(model: ir.Model) -> int:
    """Rewrite every RoPE subgraph in ``model`` in place; returns the number fused."""
    return RULES.apply_to_model(model)
