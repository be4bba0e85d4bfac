"""Symmetric quantization grids (INT8, INT4, FP8 E4M3FN) and weights on them: per-channel and
block-wise quantization, dequantization, and the fake-quant twins calibration searches with.

All grids are symmetric (zero point 0), as TensorRT 11 requires (DESIGN §5). ``x ~ q * scale``
with ``scale = amax / qmax``:

- INT8: q in [-127, 127] (the -128 code is left unused so the grid is symmetric, as in
  TensorRT and SmoothQuant). With ``bound_pairs`` the scale is also at least (largest
  |w[2i]| + |w[2i+1]| of the channel) / 127, so every pair of adjacent input channels sums to at
  most 128 in magnitude: ONNX Runtime's int8 GEMM on x86 without VNNI turns the int8 activations
  into u8 (q + 128, at most 255) and multiplies adjacent-K pairs with ``vpmaddubsw``, whose int16
  pair sums saturate above 32767 = 255 * 128.5. ORT's own remedy is 7-bit weights
  ("reduce_range", q in [-63, 63]); bounding pairs keeps more of the grid (an effective 91 of 127
  levels on Gaussian weights, 125 on heavy-tailed ones) and is just as exact (measured on an
  AVX2 host: 6.5% max relative kernel error with plain 8-bit weights, 5e-8 with bounded pairs).
- INT4: q in [-8, 7] with scale = amax / 7, per block of ``block_size`` input channels (the
  block-wise DequantizeLinear of ONNX opset 21, which ORT runs as MatMulNBits).
- FP8 E4M3FN: q = saturate(float8(x / scale)), largest finite value 448, scale = amax / 448
  (NVIDIA/Arm/Intel, "FP8 Formats for Deep Learning", 2022).

Weights are ``[K, N]`` (MatMul's B: K input channels, N output channels): per-channel means one
scale per output channel n (axis 1); block-wise means one scale per (block of K, n) (axis 0).
A grid is any object with the ``Grid`` protocol's members; a format may define its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import ml_dtypes
import numpy as np

if TYPE_CHECKING:  # torch is imported by the callers of the torch twins, not at start-up
    import torch

_TINY = 1e-12


class Grid(Protocol):
    """A symmetric grid of codes: ``x ~ code * scale`` with ``scale = amax / qmax``."""

    name: str
    qmax: float  # largest code magnitude (a Python float: float32 math stays float32)
    dtype: type  # numpy (or ml_dtypes) type of the stored codes

    def scale(self, amax: float) -> float: ...
    def round(self, x: np.ndarray) -> np.ndarray: ...
    def to_codes(self, x: np.ndarray) -> np.ndarray: ...
    def round_torch(self, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class IntGrid:
    """Symmetric integer codes ``lowest..qmax`` stored as ``dtype``."""

    name: str
    qmax: float
    lowest: float
    dtype: type

    def scale(self, amax: float) -> float:
        """The per-tensor scale for clip value ``amax``."""
        return max(float(amax), _TINY) / self.qmax

    def round(self, x: np.ndarray) -> np.ndarray:
        """``x`` (in units of the scale) rounded to the nearest code, as floats."""
        return np.clip(np.rint(x), self.lowest, self.qmax)

    def to_codes(self, x: np.ndarray) -> np.ndarray:
        """``x`` (in units of the scale) as codes of ``dtype``."""
        return self.round(x).astype(self.dtype)

    def round_torch(self, x: torch.Tensor) -> torch.Tensor:
        """torch twin of ``round``."""
        return x.round().clamp(self.lowest, self.qmax)


@dataclass(frozen=True)
class FloatGrid:
    """A saturating 8-bit float grid (largest finite value ``qmax``) stored as ``dtype``."""

    name: str
    qmax: float
    dtype: type
    torch_dtype: str  # the name of torch's dtype for the codes

    def scale(self, amax: float) -> float:
        """The per-tensor scale for clip value ``amax``."""
        return max(float(amax), _TINY) / self.qmax

    def to_codes(self, x: np.ndarray) -> np.ndarray:
        """``x`` (in units of the scale) as codes of ``dtype`` (round to nearest, saturate)."""
        return np.clip(x, -self.qmax, self.qmax).astype(self.dtype)

    def round(self, x: np.ndarray) -> np.ndarray:
        """``x`` (in units of the scale) rounded to the nearest code, as float32."""
        return self.to_codes(x).astype(np.float32)

    def round_torch(self, x: torch.Tensor) -> torch.Tensor:
        """torch twin of ``round``."""
        import torch  # loaded already: x is a tensor

        return x.clamp(-self.qmax, self.qmax).to(getattr(torch, self.torch_dtype)).float()


INT8 = IntGrid("int8", 127.0, -127.0, np.int8)
INT4 = IntGrid("int4", 7.0, -8.0, ml_dtypes.int4)
FP8_E4M3 = FloatGrid("fp8_e4m3fn", 448.0, ml_dtypes.float8_e4m3fn, "float8_e4m3fn")


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight ready for a DequantizeLinear: ``data`` [K, N] (codes of ``grid``), ``scale``
    ([N] per-channel or [ceil(K/block_size), N] block-wise, float32), the DQ ``axis`` (1
    per-channel, 0 block-wise), ``block_size`` (0 when not block-wise) and the ``grid``."""

    data: np.ndarray
    scale: np.ndarray
    axis: int
    block_size: int
    grid: Grid


def quantize_weight_per_channel(
    w: np.ndarray, grid: Grid, bound_pairs: bool = False
) -> QuantizedWeight:
    """Per-output-channel symmetric quantization of ``w`` [K, N] float32 on ``grid``;
    ``bound_pairs`` keeps every adjacent-K pair within 128 codes in magnitude (see the module
    docstring; meant for INT8)."""
    amax = np.maximum(np.abs(w).max(axis=0), _TINY).astype(np.float32)
    scale = amax / grid.qmax
    if bound_pairs:
        scale = np.maximum(scale, max_pair_sum(w) / grid.qmax)
    q = grid.to_codes(w / scale)
    return QuantizedWeight(q, scale.astype(np.float32), axis=1, block_size=0, grid=grid)


def max_pair_sum(w: np.ndarray) -> np.ndarray:
    """max_i |w[2i, n]| + |w[2i + 1, n]| per column n of ``w`` [K, N] (K padded with a zero row
    when odd), float32 [N]. With scale >= this / 127, rounding adds at most 1: pairs <= 128."""
    a = np.abs(w)
    if a.shape[0] % 2:
        a = np.concatenate([a, np.zeros((1, a.shape[1]), a.dtype)])
    return a.reshape(a.shape[0] // 2, 2, a.shape[1]).sum(axis=1).max(axis=0).astype(np.float32)


def quantize_weight_blockwise(
    w: np.ndarray, grid: Grid, block_size: int, amax: np.ndarray | None = None
) -> QuantizedWeight:
    """Block-wise symmetric quantization of ``w`` [K, N] along K on ``grid``. K need not be a
    multiple of ``block_size`` (the last block is shorter). ``amax`` [ceil(K / block_size), N]
    overrides each block's clip value (default: its max |w|)."""
    scale = (_block_amax(w, block_size) if amax is None else amax) / grid.qmax
    full = np.repeat(scale, block_size, axis=0)[: w.shape[0]]
    q = grid.to_codes(w / full)
    return QuantizedWeight(q, scale.astype(np.float32), 0, block_size, grid)


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


def fake_quant_blockwise(w: torch.Tensor, grid: Grid, block_size: int) -> torch.Tensor:
    """torch twin of ``dequantize(quantize_weight_blockwise(w, grid, block_size))`` for search
    loops (AWQ): ``w`` [K, N] float32 with K a multiple of ``block_size``."""
    k, n = w.shape
    wb = w.reshape(k // block_size, block_size, n)
    scale = wb.abs().amax(dim=1, keepdim=True).clamp_min(_TINY) / grid.qmax
    return (grid.round_torch(wb / scale) * scale).reshape(k, n)


def fake_quant_activation(x: np.ndarray, amax: float, grid: Grid) -> np.ndarray:
    """Per-tensor quantize-dequantize of ``x`` with clip value ``amax`` on ``grid`` (what a
    QuantizeLinear + DequantizeLinear pair computes)."""
    scale = grid.scale(amax)
    return grid.round(x / scale) * scale
