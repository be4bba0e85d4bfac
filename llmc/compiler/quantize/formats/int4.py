"""``--quant int4``: weight-only, block-wise with AWQ scales,
``X / s -> MatMul <- DQ(int4 W * s, block-wise along K)``.

AWQ (Lin et al., 2024) searches per-channel scales s and per-block clip values when K is a
multiple of ``--int4-block-size`` (else, or with ``--int4-method rtn``, round-to-nearest).
ONNX Runtime runs the pattern as ``MatMulNBits`` with int8 compute (accuracy level 4:
activations quantized per block to int8, so the weights run on VNNI; level 0, float compute,
was 3-8x slower here). TensorRT takes INT4 blocks of 64 or 128 input channels.

Recipes (``--recipe``): ``awq``, every decoder projection 4-bit and the vocabulary projection
8-bit weight-only (4-bit blocks of a 262,144-row projection flip the argmax); ``awq-down8``,
``*.down_proj`` 8-bit weight-only too, as llama.cpp's Q4_K_M gives ffn_down more bits (Gemma 3
270M: KL 0.105 -> 0.076, top-1 80.9% -> 82.8% at the same decode speed, benchmarks/RESULTS.md).
Which one a build gets is measured (``llmc.compiler.quantize.front``).
"""

from __future__ import annotations

import numpy as np

from llmc.compiler.quantize.rounding import rounded
from llmc.quant.grids import INT4, quantize_weight_blockwise
from llmc.quant.protocol import (
    ActivationStats,
    FormatDefaults,
    QuantFormat,
    QuantizedLinear,
    QuantSpec,
    Recipe,
    sm_of,
)

MATMULNBITS_ACCURACY_LEVEL = 4
TRT_BLOCK_SIZES = (64, 128)


class Int4(QuantFormat):
    """The `QuantFormat` of ``--quant int4`` (see the module docstring)."""

    name = "int4"
    label = "int4_weight_only"
    summary = "weight-only, block-wise, AWQ"
    recipes = (
        Recipe(
            "awq-down8",
            "4-bit AWQ blocks; the vocabulary and down projections 8-bit weight-only",
            FormatDefaults("max", weight_only8="lm_head,*.down_proj"),
        ),
        Recipe(
            "awq",
            "every decoder projection 4-bit AWQ blocks; the vocabulary projection 8-bit",
            FormatDefaults("max", weight_only8="lm_head"),
        ),
    )
    cpu_kernel = "MatMulNBits"
    weight_bytes = 0.5 + 4 / 128  # 4 bits, a float32 scale per 128
    ort_session_config = {"session.qdq_matmulnbits_accuracy_level": str(MATMULNBITS_ACCURACY_LEVEL)}

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        # torch loads when AWQ runs, not with the formats (``llmc --help`` reads their defaults)
        from llmc.calibration.awq import awq_clip, awq_search

        block = spec.int4_block_size
        s = clip = None
        record: dict = {}
        if spec.int4_method == "awq" and weight.shape[0] % block == 0:
            res = awq_search(stats.sample, stats.channel_meanabs, weight, block, INT4)
            s = res.scales if res.alpha > 0 else None
            sample = stats.sample if s is None else stats.sample / s[None, :]
            clip = awq_clip(sample, _scaled(weight, s), block, INT4)
            record.update(awq_alpha=res.alpha, mse=res.error, mse_rtn=res.error_rtn)
        w = _scaled(weight, s)
        qw, rounding = rounded(quantize_weight_blockwise(w, INT4, block, clip), w, stats, s, spec)
        record.update(rounding=rounding, format=self.label)
        return QuantizedLinear(qw, s, None, record)

    def target_error(self, target: str, spec: QuantSpec) -> str | None:
        if sm_of(target) is not None and spec.int4_block_size not in TRT_BLOCK_SIZES:
            return (
                f"--int4-block-size {spec.int4_block_size}: TensorRT supports INT4 blocks of 64 "
                "or 128 input channels; use --int4-block-size 64 or 128"
            )
        return super().target_error(target, spec)


def _scaled(w: np.ndarray, s: np.ndarray | None) -> np.ndarray:
    return w if s is None else w * s[:, None]


FORMAT = Int4()
