"""``--quant int8``: 8-bit integer weights, in one of two recipes (``--recipe``):

- ``smoothquant``: W8A8 with SmoothQuant,
  ``X / s -> Q/DQ(int8, per-tensor) -> MatMul <- DQ(int8 W * s, per-channel)``, the vocabulary
  projection 8-bit weight-only and ``*.down_proj`` float (below): the arithmetic of int8 tensor
  cores;
- ``weight-only``: every projection 8-bit weight-only in blocks of 32
  (``int8_weight_only``: llama.cpp's Q8_0 arithmetic, activations quantized per block at run
  time).

Which one a build gets is measured (``llmc.compiler.quantize.front``).

SmoothQuant's factors s (Xiao et al., 2023) use ``--smoothquant-alpha``, or the best of
``--smoothquant-alpha-grid`` per layer. ONNX Runtime fuses the pattern into
``MatMulIntegerToFloat``; on hosts without AVX-512 VNNI the weights keep adjacent pairs within
128 (``bound_pairs``, ``llmc.quant.grids``), so engines built there run exactly anywhere, and
engines built with VNNI require it.

The ``smoothquant`` recipe's choices, measured on Gemma 3 270M (benchmarks/RESULTS.md):
- the vocabulary projection 8-bit weight-only: MatMulNBits quantizes its input per block of 32
  instead of one per-tensor scale: top-1 92.13% -> 93.26%, S1 decode 2.07x -> 2.48x float32,
  S16 4.87x -> 4.28x HF eager on an AVX-512 VNNI host (``--weight-only8 ''`` gives back W8A8);
- ``*.down_proj`` float32: it reads GELU(gate) * up, heavy-tailed (max / 99th percentile ~20-50
  after SmoothQuant), which per-tensor int8 cannot hold: mean KL 0.110 -> 0.028 without it. As
  8-bit weight-only it ran as MatMulNBits, 3x slower per FLOP than W8A8 in a 2,048-token
  prefill and no faster than float32 at 16 decodes on AVX2; float32 took the S16 prefill from
  2.03 to 1.77 s at the same accuracy (KL 0.0220 -> 0.0205, top-1 90.4%);
- the percentile observer: ~20% lower mean KL than max, and beats mse (top-1 93.26% vs 91.10%).
"""

from __future__ import annotations

import numpy as np

from llmc.calibration.observers import observe_amax
from llmc.calibration.smoothquant import search_alpha, smoothquant_scales, w8a8_output_error
from llmc.compiler.quantize.rounding import rounded
from llmc.quant.grids import INT8, max_pair_sum, quantize_weight_per_channel
from llmc.quant.protocol import (
    ActivationQuant,
    ActivationStats,
    FormatDefaults,
    QuantFormat,
    QuantizedLinear,
    QuantSpec,
    Recipe,
)

VNNI = "avx512-vnni"


class Int8(QuantFormat):
    """The `QuantFormat` of ``--quant int8`` (see the module docstring)."""

    name = "int8"
    label = "int8_w8a8"
    summary = "W8A8, SmoothQuant"
    recipes = (
        Recipe(
            "smoothquant",
            "W8A8 SmoothQuant; the vocabulary projection 8-bit weight-only, down_proj float",
            FormatDefaults("percentile", weight_only8="lm_head", exclude="*.down_proj"),
        ),
        Recipe(
            "weight-only",
            "every projection 8-bit weight-only in blocks of 32, llama.cpp's Q8_0 arithmetic",
            FormatDefaults("max", weight_only8="*"),
        ),
    )
    cpu_kernel = "MatMulIntegerToFloat"
    weight_bytes = 1.0

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        record: dict = {}
        if spec.smoothquant_alphas:
            error = w8a8_output_error(stats, weight, spec.calib_method, spec.bound_pairs)
            alpha, s = search_alpha(stats.channel_absmax, weight, spec.smoothquant_alphas, error)
        else:
            alpha = spec.smoothquant_alpha
            s = smoothquant_scales(stats.channel_absmax, weight, alpha)
        record["smoothquant_alpha"] = alpha
        amax = observe_amax(stats, spec.calib_method, INT8, smoothing=s)
        record.update(format=self.label, act_amax=amax)
        w = weight * s[:, None]
        nearest = quantize_weight_per_channel(w, INT8, spec.bound_pairs)
        qw, rounding = rounded(nearest, w, stats, s, spec)
        if spec.bound_pairs and rounding == "gptq":
            # GPTQ codes that break the pair bound fall back to round-to-nearest
            if max_pair_sum(qw.data.astype(np.float32)).max() > INT8.qmax + 1:
                qw, rounding = nearest, "nearest"
        record["rounding"] = rounding
        if spec.bound_pairs:
            record["bound_pairs"] = True
        return QuantizedLinear(qw, s, ActivationQuant(INT8, amax), record)

    def cpu_isa(self, host_features: tuple[str, ...]) -> tuple[str, ...]:
        # with VNNI the weights were not pair-bounded: the engine needs VNNI
        return (VNNI,) if VNNI in host_features else ()


FORMAT = Int8()
