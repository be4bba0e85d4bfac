"""Keep q and k in token-major layout through their norm and rotary embedding.

transformers turns each projection's output [B, S, H*D] into [B, H, S, D] (``view`` then
``transpose(1, 2)``) before Gemma's q/k RMSNorm and RoPE, and the exported graph turns it back
with a second Transpose for the attention plugin, which reads [T, H*D]. Neither op needs the
head-major layout: RMSNormalization normalizes the last axis of any layout, and ONNX
``RotaryEmbedding`` (opset 23) also takes 3-D input [B, S, H*D] with ``num_heads`` (cos/sin
[B, S, D/2] index the sequence axis in both forms). So

    Transpose(0,2,1,3) -> [RMSNormalization] -> RotaryEmbedding -> Transpose(0,2,1,3)

becomes ``[RMSNormalization] -> Reshape [B, S, H*D] -> RotaryEmbedding -> Reshape [B, S, H, D]``:
two copies of q and two of k per layer fewer (Reshape only relabels), with the same values bit
for bit (measured on Gemma 3 270M int8 at a 128-token prefill: 0.99x the step time).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

_HEAD_SWAP = (0, 2, 1, 3)


def _check_head_swaps(x, first, last) -> pattern.MatchResult:
    """Both Transposes swap the head and token axes of a [B, S, H, D] tensor with static H, D."""
    result = pattern.MatchResult()
    for value in (first, last):
        perm = value.producer().attributes.get("perm")
        if perm is None or tuple(perm.as_ints()) != _HEAD_SWAP:
            return result.fail("a Transpose does not swap the head and token axes", value)
    if x.shape is None or len(x.shape) != 4:
        return result.fail("x is not [B, S, H, D]", x)
    if not (isinstance(x.shape[2], int) and isinstance(x.shape[3], int)):
        return result.fail("the number of heads or the head size is not static", x)
    return result


def _rotate_token_major(op, normed, cos, sin, rotated, x):
    """``RotaryEmbedding`` on ``normed`` [B, S, H, D] viewed as [B, S, H*D], returned as
    [B, S, H, D]; the matched node's ``interleaved`` kept."""
    heads, head_size = x.shape[2], x.shape[3]
    interleaved = rotated.producer().attributes.get("interleaved")
    flat = op.Reshape(normed, op.Constant(value_ints=[0, 0, heads * head_size]))
    out = op.RotaryEmbedding(
        flat,
        cos,
        sin,
        interleaved=0 if interleaved is None else interleaved.as_int(),
        num_heads=heads,
    )
    return op.Reshape(out, op.Constant(value_ints=[0, 0, heads, head_size]))


class NormRopeHeadLayout(pattern.RewriteRuleClassBase):
    """Transpose -> RMSNormalization -> RotaryEmbedding -> Transpose (Gemma 3's q and k)."""

    def pattern(self, op, x, weight, cos, sin):
        swapped = op.Transpose(x, _outputs=["first"])
        normed = op.RMSNormalization(swapped, weight, _outputs=["normed"])
        rotated = op.RotaryEmbedding(normed, cos, sin, _outputs=["rotated"])
        return op.Transpose(rotated, _outputs=["last"])

    def check(self, context, x, first, last, normed, **_) -> pattern.MatchResult:
        result = _check_head_swaps(x, first, last)
        axis = normed.producer().attributes.get("axis")
        if result and axis is not None and axis.as_int() not in (-1, 3):
            return result.fail("RMSNormalization does not normalize the head axis", normed)
        return result

    def rewrite(self, op, x, weight, cos, sin, normed, rotated, **_):
        attributes = {k: a.value for k, a in normed.producer().attributes.items()}
        token_major = op.RMSNormalization(x, weight, **attributes)
        return _rotate_token_major(op, token_major, cos, sin, rotated, x)


class RopeHeadLayout(pattern.RewriteRuleClassBase):
    """Transpose -> RotaryEmbedding -> Transpose (Llama's q and k)."""

    def pattern(self, op, x, cos, sin):
        swapped = op.Transpose(x, _outputs=["first"])
        rotated = op.RotaryEmbedding(swapped, cos, sin, _outputs=["rotated"])
        return op.Transpose(rotated, _outputs=["last"])

    def check(self, context, x, first, last, **_) -> pattern.MatchResult:
        return _check_head_swaps(x, first, last)

    def rewrite(self, op, x, cos, sin, rotated, **_):
        return _rotate_token_major(op, x, cos, sin, rotated, x)


RULES = pattern.RewriteRuleSet([NormRopeHeadLayout.rule(), RopeHeadLayout.rule()])


def keep_heads_token_major(model: ir.Model) -> int:
    """Rewrite every q/k Transpose pair around RMSNorm/RoPE in ``model`` in place; returns the
    number rewritten."""
    return RULES.apply_to_model(model)
