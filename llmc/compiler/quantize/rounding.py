"""Weight rounding: GPTQ on the grid a round-to-nearest quantization chose (``--weight-rounding``).

``formats`` picks each weight's grid (its scales: per channel, per block, clipped by AWQ) and
rounds to nearest; ``gptq_on_grid`` keeps that grid and those scales and re-chooses the grid
point of every weight with GPTQ (``llmc.calibration.gptq``), so the Q/DQ nodes, the ORT fusions
and the TensorRT graph are the same as with round-to-nearest, only the integer (or FP8) codes
differ.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from llmc.calibration.gptq import gptq_round
from llmc.compiler.quantize.formats import (
    FP8_MAX,
    INT4_MAX,
    INT8_MAX,
    QuantizedWeight,
    dequantize,
)


def _code_range(qw: QuantizedWeight) -> tuple[float, float] | None:
    """(lowest, highest) integer code of ``qw``'s format, or None for FP8."""
    if qw.data.dtype == ml_dtypes.float8_e4m3fn:
        return None
    if qw.data.dtype == ml_dtypes.int4:
        return -INT4_MAX - 1, INT4_MAX
    return -INT8_MAX, INT8_MAX


def gptq_on_grid(weight: np.ndarray, qw: QuantizedWeight, hessian: np.ndarray) -> QuantizedWeight:
    """``qw`` (the round-to-nearest quantization of ``weight`` [K, N] float32) with its codes
    re-chosen by GPTQ for inputs whose Gram matrix is ``hessian`` [K, K]; same dtype, scales,
    axis and block size. Raises ValueError on mismatched shapes."""
    scale = torch.from_numpy(np.asarray(qw.scale, np.float32))
    bounds = _code_range(qw)

    def rounder(w: torch.Tensor, rows: slice, idx: torch.Tensor) -> torch.Tensor:
        # w [R, m] for input channels idx: per-channel scales [N], block-wise [K / block, N]
        s = scale[idx // qw.block_size, rows].T if qw.block_size else scale[rows, None]
        if bounds is None:
            x = (w / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
        else:
            x = torch.round(w / s).clamp(*bounds)
        return x * s

    rounded = gptq_round(weight, hessian, rounder)
    unit = QuantizedWeight(np.ones_like(rounded), qw.scale, qw.axis, qw.block_size)
    codes = rounded / dequantize(unit)
    if bounds is None:
        data = np.clip(codes, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    else:
        data = np.clip(np.rint(codes), *bounds).astype(qw.data.dtype)
    return QuantizedWeight(data, qw.scale, qw.axis, qw.block_size)


def smoothed_hessian(gram: np.ndarray, smoothing: np.ndarray | None) -> np.ndarray:
    """The Gram matrix of ``X / s`` (channel-wise) from that of X: ``H / (s s^T)``."""
    if smoothing is None:
        return gram
    inv = 1.0 / smoothing.astype(np.float64)
    return gram * inv[:, None] * inv[None, :]
