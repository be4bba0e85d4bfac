"""llama.cpp's Q8_0 weights as a block-wise INT8 ``QuantizedWeight`` (the accuracy anchor of a
build from a GGUF checkpoint, ``llmc.compiler.quantize.anchors``).

Q8_0 (ggml ``quantize_row_q8_0_ref``, ggml-quants.c): blocks of 32 consecutive weights along
the reduction dimension; per block d = max|x| / 127 (float32), codes q = roundf(x / d) (half
away from zero) computed with the float32 d, then d stored as float16. The dequantized weight
is q * float16(d): a DequantizeLinear of the INT8 codes with block size 32 and the float16
scales widened to float32 gives exactly llama.cpp's values.
"""

from __future__ import annotations

import numpy as np

from llmc.quant.grids import INT8, QuantizedWeight

#: Weights per Q8_0 block.
QK8_0 = 32
#: Output channels quantized at a time (their blocks are independent): bounds the temporaries.
COLUMNS = 4096


def quantize_q8_0(w: np.ndarray) -> QuantizedWeight:
    """Q8_0 of ``w`` [K, N] float32 (MatMul's B; blocks run along K), ``COLUMNS`` output
    channels at a time: the temporaries of a 262,144-word vocabulary projection stay a few MB
    instead of several copies of the weight. Raises ValueError when K is not a multiple of 32
    (llama.cpp quantizes whole blocks only)."""
    k, n = w.shape
    if k % QK8_0:
        raise ValueError(f"Q8_0 needs K a multiple of {QK8_0}, got {k}")
    data = np.empty((k, n), np.int8)
    scale = np.empty((k // QK8_0, n), np.float32)
    for c in range(0, n, COLUMNS):
        cols = slice(c, min(c + COLUMNS, n))
        data[:, cols], scale[:, cols] = _q8_0_columns(w[:, cols])
    return QuantizedWeight(data, scale, axis=0, block_size=QK8_0, grid=INT8)


def _q8_0_columns(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes [K, n] int8, float16-rounded scales [K/32, n] float32) of ``w`` [K, n]."""
    k, n = w.shape
    blocks = np.asarray(w, np.float32).reshape(k // QK8_0, QK8_0, n)
    d = np.abs(blocks).max(axis=1) / np.float32(127)  # [K/32, n] float32
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    scaled = blocks * inv[:, None, :]
    # roundf: half away from zero. floor(a + 0.5) would round 0.49999997 up in float32.
    a = np.abs(scaled)
    whole = np.floor(a)
    codes = np.sign(scaled) * (whole + np.floor(2 * (a - whole)))
    return codes.reshape(k, n).astype(np.int8), d.astype(np.float16).astype(np.float32)
