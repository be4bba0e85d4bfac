"""Weight rounding: GPTQ on the grid a round-to-nearest quantization chose (``--weight-rounding``).

A format picks each weight's grid and scales (per channel, per block, clipped by AWQ) and rounds
to nearest; ``gptq_on_grid`` keeps that grid and those scales and re-chooses the grid point of
every weight with GPTQ (``llmc.calibration.gptq``), so the Q/DQ nodes, the ORT fusions and the
TensorRT graph are the same as with round-to-nearest, only the integer (or FP8) codes differ.
"""

from __future__ import annotations

import numpy as np

from llmc.quant.grids import QuantizedWeight
from llmc.quant.protocol import ActivationStats, QuantSpec

#: Input channels converted to codes at a time (bounds the rounding's float temporaries).
CODE_ROWS = 512


def gptq_on_grid(
    weight: np.ndarray,
    qw: QuantizedWeight,
    gram: np.ndarray,
    smoothing: np.ndarray | None = None,
    factor=None,
) -> QuantizedWeight:
    """``qw`` (the round-to-nearest quantization of ``weight`` [K, N] float32) with its codes
    re-chosen by GPTQ for inputs X whose Gram matrix is ``gram`` = X^T X [K, K], or for the
    inputs X / ``smoothing`` [K] (channel-wise) when given; same grid, scales, axis and block
    size. ``factor``: GPTQ's factorization of them (``gptq.act_order_factor``), when made
    already. Raises ValueError on mismatched shapes."""
    # torch loads when GPTQ runs, not with the formats (``llmc --help`` reads their defaults)
    import torch

    from llmc.calibration.gptq import gptq_round_chunks

    scale = torch.from_numpy(np.asarray(qw.scale, np.float32))

    def rounder(w: torch.Tensor, rows: slice, idx: torch.Tensor) -> torch.Tensor:
        # w [R, m] for input channels idx: per-channel scales [N], block-wise [K / block, N]
        s = scale[idx // qw.block_size, rows].T if qw.block_size else scale[rows, None]
        return qw.grid.round_torch(w / s) * s

    # codes one chunk of output channels at a time, divided by their scales in place and
    # converted CODE_ROWS input channels at a time: no float32 array of the chunk's size beside it
    data = np.empty_like(qw.data)
    for rows, chunk in gptq_round_chunks(weight, gram, rounder, smoothing, factor):
        _divide_by_scales(chunk, qw, rows)
        for k0 in range(0, chunk.shape[0], CODE_ROWS):
            data[k0 : k0 + CODE_ROWS, rows] = qw.grid.to_codes(chunk[k0 : k0 + CODE_ROWS])
    return QuantizedWeight(data, qw.scale, qw.axis, qw.block_size, qw.grid)


def _divide_by_scales(chunk: np.ndarray, qw: QuantizedWeight, rows: slice) -> None:
    """``chunk`` [K, len(rows)] float32 (output channels ``rows`` of a weight on ``qw``'s grid)
    divided in place by its scales: per output channel, or per block of ``qw.block_size``
    input channels (the last block may be shorter). The same float32 quotients as dividing by
    ``dequantize`` of unit codes."""
    if not qw.block_size:
        chunk /= np.asarray(qw.scale, np.float32)[rows][None, :]
        return
    for b, k0 in enumerate(range(0, chunk.shape[0], qw.block_size)):
        chunk[k0 : k0 + qw.block_size] /= np.asarray(qw.scale[b, rows], np.float32)[None, :]


def rounded(
    qw: QuantizedWeight,
    w: np.ndarray,
    stats: ActivationStats | None,
    smoothing: np.ndarray | None,
    spec: QuantSpec,
) -> tuple[QuantizedWeight, str]:
    """``qw`` (the round-to-nearest quantization of ``w``) re-rounded by GPTQ (inputs
    ``X / smoothing``) when ``spec`` asks for it and the Gram matrix was collected, and the
    rounding used: "gptq" or "nearest"."""
    if spec.weight_rounding != "gptq" or stats is None or stats.gram is None:
        return qw, "nearest"
    return gptq_on_grid(w, qw, stats.gram, smoothing, _factor(stats, smoothing)), "gptq"


def _factor(stats: ActivationStats, smoothing: np.ndarray | None):
    """GPTQ's factorization of ``stats``' Gram matrix for ``smoothing``, made once per
    statistics object where it keeps them (``TensorStats.factors``), else None (made by the
    rounding). A factorization costs 0.04 s at 640 input channels, 0.08 s at 1,024 and 0.40 s
    at 2,048 (2 cores, AMD EPYC Zen 4): made again for each format an accuracy-target build
    rounds a module in, and each 8,192-column chunk of a vocabulary projection, it was 10-20%
    of the quantize stage."""
    from llmc.calibration.gptq import act_order_factor

    memo = getattr(stats, "factors", None)
    if memo is None:
        return None
    key = None if smoothing is None else np.asarray(smoothing, np.float32).tobytes()
    if key not in memo:
        memo[key] = act_order_factor(stats.gram, smoothing)
    return memo[key]
