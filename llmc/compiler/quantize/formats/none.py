"""``--quant none``: float weights and activations; nothing to calibrate or rewrite."""

from __future__ import annotations

import numpy as np

from llmc.quant.protocol import ActivationStats, QuantFormat, QuantizedLinear, QuantSpec


class NoQuantization(QuantFormat):
    """The `QuantFormat` of ``--quant none``: every module stays float."""

    name = "none"
    label = "none"
    summary = "float"
    quantizes = False
    needs_stats = False
    fallbacks = ()

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        raise ValueError("cannot quantize to 'none'")


FORMAT = NoQuantization()
