"""AWQ: activation-aware scaling for weight-only INT4 (block-wise) quantization.

Lin et al., "AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration"
(MLSys 2024), §3.2-3.3: scale each input channel j of W by ``s_j = mean|X_j|^alpha`` before
quantization (salient channels get finer steps) and divide the activation by s; alpha is found
by grid search over [0, 1] minimizing ``||X W - (X / s) Q(diag(s) W)||^2`` on calibration
activations. alpha = 0 is round-to-nearest (RTN), so the search never does worse than RTN on the
calibration sample. Then, as AWQ's clipping step (§3.3, "auto_clip"), each block's clip value
is shrunk where that lowers the block's own output error ``||X_b (w_b - Q(w_b))||^2``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llmc.quant.grids import INT4, Grid, fake_quant_blockwise

GRID = 20
CLIP_GRID = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)
SEARCH_ROWS = 256  # activation rows the searches evaluate (of the calibration sample)


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
    sample: np.ndarray,
    act_meanabs: np.ndarray,
    weight: np.ndarray,
    block_size: int,
    grid: Grid = INT4,
) -> AwqResult:
    """Search AWQ scales for ``weight`` [K, N] (block-wise on ``grid``) given activation rows
    ``sample`` [R, K] and the per-channel mean |x| ``act_meanabs`` [K] over all calibration
    tokens. K must be a multiple of ``block_size`` (ValueError otherwise)."""
    k = weight.shape[0]
    if k % block_size:
        raise ValueError(f"AWQ needs K ({k}) to be a multiple of the int4 block size {block_size}")
    x = torch.from_numpy(np.array(sample[:SEARCH_ROWS], np.float32))
    w = torch.from_numpy(np.array(weight, np.float32))
    mean = torch.from_numpy(act_meanabs.astype(np.float32)).clamp_min(1e-6)
    reference = x @ w
    best = None
    error_rtn = None
    for i in range(GRID + 1):
        alpha = i / GRID
        s = mean**alpha
        s = s / torch.sqrt(s.max() * s.min())
        q = fake_quant_blockwise(w * s[:, None], grid, block_size)
        err = float(((x / s) @ q - reference).pow(2).mean())
        if i == 0:
            error_rtn = err
        if best is None or err < best[0]:
            best = (err, alpha, s)
    err, alpha, s = best
    return AwqResult(s.numpy().astype(np.float32), alpha, err, float(error_rtn))


@torch.no_grad()
def awq_clip(
    sample: np.ndarray, weight: np.ndarray, block_size: int, grid: Grid = INT4
) -> np.ndarray:
    """Per-block clip values [K / block_size, N] float32 for block-wise quantization on ``grid`` of
    ``weight`` [K, N] (already AWQ-scaled) given activation rows ``sample`` [R, K] (already
    divided by the AWQ scales): for each (block, output channel) the factor in ``CLIP_GRID`` x
    max|w| with the least ``||X_b (w_b - Q(w_b))||^2``. K must be a multiple of block_size."""
    k, n = weight.shape
    nb = k // block_size
    x = torch.from_numpy(np.array(sample[:SEARCH_ROWS], np.float32)).reshape(-1, nb, block_size)
    w = torch.from_numpy(np.array(weight, np.float32)).reshape(nb, block_size, n)
    amax = w.abs().amax(dim=1).clamp_min(1e-12)  # [nb, N]
    best_err = torch.full((nb, n), float("inf"))
    best = amax.clone()
    for ratio in CLIP_GRID:
        clip = amax * ratio
        scale = (clip / grid.qmax)[:, None, :]
        q = grid.round_torch(w / scale) * scale
        err = torch.einsum("rgb,gbn->rgn", x, w - q).pow(2).sum(dim=0)  # [nb, N]
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, clip, best)
    return best.numpy().astype(np.float32)
