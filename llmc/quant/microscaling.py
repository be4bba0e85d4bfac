"""Microscaling grids: NVFP4 and MXFP8 block scales, and weights and activations on them.

Both formats give every block of consecutive elements along K (the reduction dimension) its own
scale: for a weight [K, N] (MatMul's B) one scale per (block of rows, column), for an activation
[..., K] one per block of its last axis. K must be a multiple of the block (``check_blocks``).

- NVFP4 (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025;
  TensorRT "Quantization Schemes"): FP4 E2M1 elements (+-{0, 0.5, 1, 1.5, 2, 3, 4, 6}), an FP8
  E4M3 scale per block of 16 and a float32 per-tensor ("global") scale g = amax / (6 * 448):
  block scale s = E4M3(block_amax / 6 / g) (saturating at 448), element
  q = E2M1(x / (s * g)) (round to nearest even, saturating at +-6), x ~ q * (s * g). A block whose
  scale rounds to 0 dequantizes to 0 (its elements are divided by ``TINY`` instead, so nothing is
  NaN). Weights take g from their own amax, activations from the calibration's (static), while
  their block scales are computed at run time.
- MXFP8 (OCP Microscaling Formats (MX) Specification v1.0, 2023, §6.3): E4M3 elements and an
  E8M0 (power of two) scale per block of 32: scale = 2^(floor(log2(block_amax)) - 8) (8: E4M3's
  largest exponent), element = E4M3(x / scale) (round to nearest even, saturating at +-448).
  The block amax is taken as at least 2^-119, so the exponent is never below E8M0's -127 (a
  block of zeros gets scale 2^-127 and zero elements).

Every step is float32 arithmetic in the order written above (``x / 6 / g`` is two divisions),
so the CPU emulation (``llmc.compiler.quantize.formats.microscaling_emulation``) reproduces these
functions
bit for bit. TensorRT's kernels compute the same quantities; whether they agree to the last bit
(e.g. a reciprocal multiply for a division) has not been checked: no Blackwell GPU here. Numpy
and ml_dtypes only (torch in ``round_torch``, for GPTQ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from llmc.errors import LlmcError
from llmc.quant.grids import FP8_E4M3, QuantizedWeight
from llmc.quant.protocol import ActivationQuant

if TYPE_CHECKING:
    import torch

NVFP4_BLOCK = 16
MXFP8_BLOCK = 32
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_EMAX = 8  # largest exponent of E4M3 (448 = 1.75 * 2^8)
E8M0_BIAS = 127
MXFP8_MIN_AMAX = 2.0**-119  # floor(log2) - 8 = -127, the smallest E8M0 scale
#: What a zero NVFP4 block scale is replaced by where elements are divided by it.
TINY = np.float32(2.0**-126)


class BlockSizeError(LlmcError, ValueError):
    """A weight's K is not a multiple of its format's block."""


@dataclass(frozen=True)
class E2M1Grid:
    """FP4 E2M1 codes (+-{0, 0.5, 1, 1.5, 2, 3, 4, 6}), a ``grids.Grid``: round to nearest even,
    saturating at +-6, stored as ``ml_dtypes.float4_e2m1fn``."""

    name: str = "fp4_e2m1"
    qmax: float = E2M1_MAX
    dtype: type = ml_dtypes.float4_e2m1fn

    def scale(self, amax: float) -> float:
        """The per-tensor scale for clip value ``amax``."""
        return max(float(amax), float(TINY)) / self.qmax

    def to_codes(self, x: np.ndarray) -> np.ndarray:
        """``x`` (in units of the scale) as E2M1 codes."""
        return np.clip(x, -self.qmax, self.qmax).astype(self.dtype)

    def round(self, x: np.ndarray) -> np.ndarray:
        """``x`` rounded to the nearest code, as float32."""
        return self.to_codes(x).astype(np.float32)

    def round_torch(self, x: torch.Tensor) -> torch.Tensor:
        """torch twin of ``round``: the grid's step is 0.5 below 2, 1 below 4, 2 above, and
        torch rounds half to even as E2M1 does."""
        import torch  # loaded already: x is a tensor

        a = x.abs()
        step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(x.dtype)
        return (torch.round(x / step) * step).clamp(-self.qmax, self.qmax)


FP4_E2M1 = E2M1Grid()


@dataclass(frozen=True)
class MicroscaledWeight(QuantizedWeight):
    """A block-wise weight with its scales as stored: ``scale`` [K / block, N] is the float32
    scale each element is multiplied by (NVFP4: ``block_scale`` * ``global_scale``; MXFP8:
    2^(``block_scale`` - 127)); ``block_scale`` holds the stored codes (NVFP4: E4M3; MXFP8:
    uint8 biased E8M0 exponents); ``global_scale`` is NVFP4's per-tensor scale (None for
    MXFP8)."""

    block_scale: np.ndarray | None = None
    global_scale: float | None = None


@dataclass(frozen=True)
class BlockActivationQuant(ActivationQuant):
    """Dynamic per-block quantization of a MatMul's input along its last axis: blocks of
    ``block_size`` on ``grid`` (FP4_E2M1: NVFP4, whose per-tensor scale is
    ``nvfp4_global_scale(amax)``; FP8_E4M3: MXFP8, ``amax`` unused); the block scales are
    computed at run time."""

    block_size: int = NVFP4_BLOCK


def check_blocks(k: int, block: int, what: str) -> None:
    """Raise BlockSizeError unless ``k`` input channels split into blocks of ``block``;
    ``what`` names the format in the message."""
    if k % block:
        raise BlockSizeError(
            f"{what} quantizes blocks of {block} input channels, but a weight has K = {k}, "
            f"not a multiple of {block}: keep its module out of the format with --exclude or "
            "--weight-only8"
        )


def nvfp4_global_scale(amax: float) -> np.float32:
    """NVFP4's per-tensor scale for a tensor of max |x| ``amax``: amax / (6 * 448)."""
    return np.float32(max(float(amax), float(TINY))) / np.float32(E2M1_MAX * E4M3_MAX)


def _nvfp4_blocks(xb: np.ndarray, g: np.float32, axis: int):
    """(codes, E4M3 block scales, float32 scales) of ``xb``, whose ``axis`` runs within a block."""
    amax = np.abs(xb).max(axis=axis, keepdims=True)
    s8 = np.minimum(amax / np.float32(E2M1_MAX) / g, np.float32(E4M3_MAX))
    s8 = s8.astype(ml_dtypes.float8_e4m3fn)
    full = s8.astype(np.float32) * g
    return FP4_E2M1.to_codes(xb / np.maximum(full, TINY)), s8, full


def _mxfp8_blocks(xb: np.ndarray, axis: int):
    """(codes, uint8 E8M0 exponents, float32 scales) of ``xb``, whose ``axis`` runs within a
    block."""
    amax = np.maximum(np.abs(xb).max(axis=axis, keepdims=True), np.float32(MXFP8_MIN_AMAX))
    exponent = np.frexp(amax)[1] - 1 - E4M3_EMAX  # frexp: amax = m * 2^e, m in [0.5, 1)
    scale = np.ldexp(np.float32(1.0), exponent).astype(np.float32)
    codes = np.clip(xb / scale, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    return codes, (exponent + E8M0_BIAS).astype(np.uint8), scale


def quantize_nvfp4(w: np.ndarray) -> MicroscaledWeight:
    """NVFP4 quantization of ``w`` [K, N] float32 (blocks of 16 along K, the per-tensor scale
    from max |w|). Raises BlockSizeError when K is not a multiple of 16."""
    k, n = w.shape
    check_blocks(k, NVFP4_BLOCK, "--quant nvfp4")
    w = np.asarray(w, np.float32)
    g = nvfp4_global_scale(float(np.abs(w).max(initial=0.0)))
    codes, s8, full = _nvfp4_blocks(w.reshape(k // NVFP4_BLOCK, NVFP4_BLOCK, n), g, axis=1)
    return MicroscaledWeight(
        codes.reshape(k, n), full[:, 0], 0, NVFP4_BLOCK, FP4_E2M1, s8[:, 0], float(g)
    )


def quantize_mxfp8(w: np.ndarray) -> MicroscaledWeight:
    """MXFP8 quantization of ``w`` [K, N] float32 (blocks of 32 along K). Raises
    BlockSizeError when K is not a multiple of 32."""
    k, n = w.shape
    check_blocks(k, MXFP8_BLOCK, "--quant mxfp8")
    wb = np.asarray(w, np.float32).reshape(k // MXFP8_BLOCK, MXFP8_BLOCK, n)
    codes, exponents, scale = _mxfp8_blocks(wb, axis=1)
    return MicroscaledWeight(
        codes.reshape(k, n), scale[:, 0], 0, MXFP8_BLOCK, FP8_E4M3, exponents[:, 0]
    )


def fake_quant_nvfp4(x: np.ndarray, global_scale: float) -> np.ndarray:
    """What TensorRT's dynamic NVFP4 quantization of activations ``x`` [..., K] float32 (blocks
    of 16 along the last axis, per-tensor scale ``global_scale``) then dequantization gives."""
    xb = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, NVFP4_BLOCK)
    codes, _, full = _nvfp4_blocks(xb, np.float32(global_scale), axis=-1)
    return (codes.astype(np.float32) * full).reshape(x.shape)


def fake_quant_mxfp8(x: np.ndarray) -> np.ndarray:
    """What dynamic MXFP8 quantization of activations ``x`` [..., K] float32 (blocks of 32
    along the last axis) then dequantization gives."""
    xb = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, MXFP8_BLOCK)
    codes, _, scale = _mxfp8_blocks(xb, axis=-1)
    return (codes.astype(np.float32) * scale).reshape(x.shape)
