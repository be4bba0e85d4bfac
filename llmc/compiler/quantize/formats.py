"""Symmetric quantization grids: INT8, FP8 E4M3FN, INT4; per-tensor, per-channel, block-wise.

All formats are symmetric (zero point 0), as TensorRT 11 requires (DESIGN §5). ``x ~ q * scale``:

- INT8: q in [-127, 127] (the -128 code is left unused so the grid is symmetric, as in
  TensorRT and SmoothQuant), scale = amax / 127. With ``bound_pairs`` the scale is also at
  least (largest |w[2i]| + |w[2i+1]| of the channel) / 127, so every pair of adjacent input
  channels sums to at most 128 in magnitude: ONNX Runtime's int8 GEMM on x86 without VNNI turns
  the int8 activations into u8 (q + 128, at most 255) and multiplies adjacent-K pairs with
  ``vpmaddubsw``, whose int16 pair sums saturate above 32767 = 255 * 128.5. ORT's own remedy is
  7-bit weights ("reduce_range", q in [-63, 63]); bounding pairs keeps more of the grid (an
  effective 91 of 127 levels on Gaussian weights, 125 on heavy-tailed ones) and is just as exact
  (measured here on an AVX2 host: 6.5% max relative kernel error with plain 8-bit weights, 5e-8
  with bounded pairs).
- FP8 E4M3FN: q = saturate(float8(x / scale)), largest finite value 448, scale = amax / 448
  (NVIDIA/Arm/Intel, "FP8 Formats for Deep Learning", 2022).
- INT4: q in [-8, 7] with scale = amax / 7 per block of ``block_size`` input channels (the
  block-wise DequantizeLinear of ONNX opset 21, which ORT runs as MatMulNBits).

Weights are ``[K, N]`` (MatMul's B: K input channels, N output channels): per-channel means one
scale per output channel n (axis 1); block-wise means one scale per (block of K, n) (axis 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import torch

INT8_MAX = 127.0
INT4_MAX = 7.0
FP8_MAX = 448.0
_TINY = 1e-12


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight ready for a DequantizeLinear: ``data`` [K, N] (int8, int4 or float8_e4m3fn numpy
    dtypes), ``scale`` ([N] per-channel or [ceil(K/block_size), N] block-wise, float32), the DQ
    ``axis`` (1 per-channel, 0 block-wise) and ``block_size`` (0 when not block-wise)."""

    data: np.ndarray
    scale: np.ndarray
    axis: int
    block_size: int


def quantize_weight_per_channel(
    w: np.ndarray, fmt: str, bound_pairs: bool = False
) -> QuantizedWeight:
    """Per-output-channel symmetric quantization of ``w`` [K, N] float32 to ``fmt`` "int8" or
    "fp8"; ``bound_pairs`` keeps every adjacent-K int8 pair within 128 in magnitude (see the
    module docstring). Raises ValueError for another format."""
    amax = np.maximum(np.abs(w).max(axis=0), _TINY).astype(np.float32)
    if fmt == "int8":
        scale = amax / INT8_MAX
        if bound_pairs:
            scale = np.maximum(scale, max_pair_sum(w) / INT8_MAX)
        q = np.clip(np.rint(w / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    elif fmt == "fp8":
        scale = amax / FP8_MAX
        q = np.clip(w / scale, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    else:
        raise ValueError(f"per-channel weight format must be int8 or fp8, not {fmt!r}")
    return QuantizedWeight(q, scale.astype(np.float32), axis=1, block_size=0)


def max_pair_sum(w: np.ndarray) -> np.ndarray:
    """max_i |w[2i, n]| + |w[2i + 1, n]| per column n of ``w`` [K, N] (K padded with a zero row
    when odd), float32 [N]. With scale >= this / 127, rounding adds at most 1: pairs <= 128."""
    a = np.abs(w)
    if a.shape[0] % 2:
        a = np.concatenate([a, np.zeros((1, a.shape[1]), a.dtype)])
    return a.reshape(a.shape[0] // 2, 2, a.shape[1]).sum(axis=1).max(axis=0).astype(np.float32)


def quantize_weight_blockwise(
    w: np.ndarray, bits: int, block_size: int, amax: np.ndarray | None = None
) -> QuantizedWeight:
    """Block-wise symmetric quantization of ``w`` [K, N] along K: ``bits`` 4 (int4, [-8, 7]) or
    8 (int8, [-127, 127]). K need not be a multiple of ``block_size`` (the last block is
    shorter). ``amax`` [ceil(K / block_size), N] overrides each block's clip value (default:
    its max |w|). Raises ValueError for other bit widths."""
    if bits not in (4, 8):
        raise ValueError(f"block-wise weights are 4 or 8 bit, not {bits}")
    qmax = INT4_MAX if bits == 4 else INT8_MAX
    scale = (_block_amax(w, block_size) if amax is None else amax) / qmax
    full = np.repeat(scale, block_size, axis=0)[: w.shape[0]]
    q = np.clip(np.rint(w / full), -qmax - 1 if bits == 4 else -qmax, qmax)
    dtype = ml_dtypes.int4 if bits == 4 else np.int8
    return QuantizedWeight(q.astype(dtype), scale.astype(np.float32), axis=0, block_size=block_size)


def dequantize(qw: QuantizedWeight) -> np.ndarray:
    """The float32 [K, N] weight a DequantizeLinear of ``qw`` produces."""
    data = qw.data.astype(np.float32)
    if qw.block_size:
        full = np.repeat(qw.scale, qw.block_size, axis=0)[: data.shape[0]]
        return data * full
    return data * qw.scale[None, :]


def _block_amax(w: np.ndarray, block_size: int) -> np.ndarray:
    k, n = w.shape
    nb = -(-k // block_size)
    pad = nb * block_size - k
    a = np.abs(w)
    if pad:
        a = np.concatenate([a, np.zeros((pad, n), a.dtype)])
    return np.maximum(a.reshape(nb, block_size, n).max(axis=1), _TINY).astype(np.float32)


def fake_quant_int4_blockwise(w: torch.Tensor, block_size: int) -> torch.Tensor:
    """torch twin of ``dequantize(quantize_weight_blockwise(w, 4, block_size))`` for search
    loops (AWQ): ``w`` [K, N] float32 with K a multiple of ``block_size``."""
    k, n = w.shape
    wb = w.reshape(k // block_size, block_size, n)
    scale = wb.abs().amax(dim=1, keepdim=True).clamp_min(_TINY) / INT4_MAX
    return (torch.round(wb / scale).clamp(-INT4_MAX - 1, INT4_MAX) * scale).reshape(k, n)


def fake_quant_activation(x: np.ndarray, amax: float, fmt: str) -> np.ndarray:
    """Per-tensor quantize-dequantize of ``x`` with clip value ``amax`` in ``fmt`` "int8" or
    "fp8" (what a QuantizeLinear + DequantizeLinear pair computes)."""
    scale = max(float(amax), _TINY) / (INT8_MAX if fmt == "int8" else FP8_MAX)
    if fmt == "int8":
        return np.clip(np.rint(x / scale), -INT8_MAX, INT8_MAX) * scale
    if fmt == "fp8":
        y = np.clip(x / scale, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
        return y.astype(np.float32) * scale
    raise ValueError(f"activation format must be int8 or fp8, not {fmt!r}")


def activation_scale(amax: float, fmt: str) -> float:
    """The per-tensor scale of a QuantizeLinear for clip value ``amax`` in ``fmt``."""
    return max(float(amax), _TINY) / (INT8_MAX if fmt == "int8" else FP8_MAX)
