"""AWQ: activation-aware scaling for weight-only INT4 (block-wise) quantization.

Lin et al., "AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration"
(MLSys 2024), §3.2-3.3: scale each input channel j of W by ``s_j = mean|X_j|^alpha`` before
quantization (salient channels get finer steps) and divide the activation by s; alpha is found
by grid search over [0, 1] minimizing ``||X W - (X / s) Q(diag(s) W)||^2`` on calibration
activations. alpha = 0 is round-to-nearest (RTN), so the search never does worse than RTN on the
calibration sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llmc.compiler.quantize.formats import fake_quant_int4_blockwise

GRID = 20


@dataclass(frozen=True)
class AwqResult:
    """The chosen scales ``s`` [K] float32, their exponent ``alpha``, and the output MSE on the
    calibration sample with AWQ (``error``) and with plain RTN (``error_rtn``)."""

    scales: np.ndarray
    alpha: float
    error: float
    error_rtn: float


@torch.no_grad()
def awq_search(
    sample: np.ndarray, act_meanabs: np.ndarray, weight: np.ndarray, block_size: int
) -> AwqResult:
    """Search AWQ scales for ``weight`` [K, N] given activation rows ``sample`` [R, K] and the
    per-channel mean |x| ``act_meanabs`` [K] over all calibration tokens. K must be a multiple
    of ``block_size`` (ValueError otherwise)."""
    k = weight.shape[0]
    if k % block_size:
        raise ValueError(f"AWQ needs K ({k}) to be a multiple of the int4 block size {block_size}")
    x = torch.from_numpy(np.array(sample, np.float32))
    w = torch.from_numpy(np.array(weight, np.float32))
    mean = torch.from_numpy(act_meanabs.astype(np.float32)).clamp_min(1e-6)
    reference = x @ w
    best = None
    error_rtn = None
    for i in range(GRID + 1):
        alpha = i / GRID
        s = mean**alpha
        s = s / torch.sqrt(s.max() * s.min())
        q = fake_quant_int4_blockwise(w * s[:, None], block_size)
        err = float(((x / s) @ q - reference).pow(2).mean())
        if i == 0:
            error_rtn = err
        if best is None or err < best[0]:
            best = (err, alpha, s)
    err, alpha, s = best
    return AwqResult(s.numpy().astype(np.float32), alpha, err, float(error_rtn))
