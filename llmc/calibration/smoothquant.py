"""SmoothQuant: migrate activation outliers into the weights before W8A8 quantization.

Xiao et al., "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large Language
Models" (ICML 2023), eq. 4: for ``Y = X W`` with X [T, K], W [K, N],
``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` and ``Y = (X diag(s)^-1)(diag(s) W)``.
alpha = 0.5 by default (the paper's choice for most models; ``--smoothquant-alpha``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from llmc.calibration.observers import TensorStats, observe_amax
from llmc.quant.grids import INT8, dequantize, fake_quant_activation, quantize_weight_per_channel

_FLOOR = 1e-5


def smoothquant_scales(
    act_channel_absmax: np.ndarray, weight: np.ndarray, alpha: float
) -> np.ndarray:
    """Per-input-channel factors ``s`` [K] float32 (divide X's channel j by s_j, multiply W's
    row j by s_j). ``act_channel_absmax`` [K]; ``weight`` [K, N]. Raises ValueError if alpha is
    outside [0, 1] or the shapes disagree."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"SmoothQuant alpha must be in [0, 1], got {alpha}")
    if act_channel_absmax.shape[0] != weight.shape[0]:
        raise ValueError(
            f"activation has {act_channel_absmax.shape[0]} channels, W has K={weight.shape[0]}"
        )
    a = np.maximum(act_channel_absmax.astype(np.float64), _FLOOR)
    w = np.maximum(np.abs(weight).max(axis=1).astype(np.float64), _FLOOR)
    s = a**alpha / w ** (1.0 - alpha)
    return np.maximum(s, _FLOOR).astype(np.float32)


def search_alpha(
    act_channel_absmax: np.ndarray,
    weight: np.ndarray,
    alphas: Sequence[float],
    error: Callable[[np.ndarray], float],
) -> tuple[float, np.ndarray]:
    """The alpha of ``alphas`` whose scales give the smallest ``error(s)`` (the caller's measure
    of the quantized layer's output error with smoothing ``s``; ties keep the first), and those
    scales [K] float32. A per-layer grid search of SmoothQuant's alpha: the paper picks one alpha
    per model on a held-out set (sec. 4.1); a layer's error moves with its own outliers, so one
    alpha for all layers fits few of them. Raises ValueError if ``alphas`` is empty or outside
    [0, 1]."""
    if not alphas:
        raise ValueError("search_alpha needs at least one alpha")
    best: tuple[float, float, np.ndarray] | None = None
    for alpha in alphas:
        s = smoothquant_scales(act_channel_absmax, weight, alpha)
        e = float(error(s))
        if best is None or e < best[0]:
            best = (e, float(alpha), s)
    return best[1], best[2]


def w8a8_output_error(
    stats: TensorStats, w: np.ndarray, calib_method: str, bound_pairs: bool
) -> Callable[[np.ndarray], float]:
    """error(s): mean squared difference between X W and its int8 W8A8 version with smoothing s
    (activation clip by ``calib_method``, weights per-channel, ``bound_pairs`` as in
    ``llmc.quant.grids``), X the calibration sample; W [K, N] cut to <= 4096 evenly spaced
    columns (the vocabulary projection has 262,144). For ``search_alpha``."""
    x = stats.sample.astype(np.float32)
    cols = np.arange(w.shape[1])[:: max(1, w.shape[1] // 4096)][:4096]
    wc = w[:, cols]
    reference = x @ wc

    def error(s: np.ndarray) -> float:
        amax = observe_amax(stats, calib_method, INT8, smoothing=s)
        xq = fake_quant_activation(x / s[None, :], amax, INT8)
        qw = quantize_weight_per_channel(wc * s[:, None], INT8, bound_pairs)
        return float(np.mean((xq @ dequantize(qw) - reference) ** 2))

    return error
