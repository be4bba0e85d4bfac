"""SmoothQuant: migrate activation outliers into the weights before W8A8 quantization.

Xiao et al., "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large Language
Models" (ICML 2023), eq. 4: for ``Y = X W`` with X [T, K], W [K, N],
``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` and ``Y = (X diag(s)^-1)(diag(s) W)``.
alpha = 0.5 by default (the paper's choice for most models; ``--smoothquant-alpha``).
"""

from __future__ import annotations

import numpy as np

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
