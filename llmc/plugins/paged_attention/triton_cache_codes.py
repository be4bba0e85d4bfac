"""KV cache codes in Triton: FP8 E4M3FN and int8 quantization as the paged-attention kernels
write and read them (reference.py's ``quantize_kv``/``dequantize_kv``, bit for bit).

A quantized cache holds ``saturate(round_half_even(x / scale))`` (IEEE division, ``div_rn``).
FP8 codes are made and read with integer arithmetic, not casts: the interpreter's float32 -> fp8
cast rounds ties away from zero and flushes subnormals (measured here), and the same code then
runs on every GPU (no sm89 conversion instructions). ``CACHE_QUANT``: 0 none, 1 FP8 (the cache
passed as its uint8 view), 2 int8. Imports ``triton``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_half_even(x):
    """``x`` (float32 block) rounded to the nearest integer, ties to even (as numpy's
    ``rint`` and ONNX QuantizeLinear), still float32."""
    floor = tl.floor(x)
    frac = x - floor
    odd = (floor - 2.0 * tl.floor(floor * 0.5)) != 0.0
    return floor + ((frac > 0.5) | ((frac == 0.5) & odd)).to(tl.float32)


@triton.jit
def fp8_round(y):
    """float32 in [-448, 448] -> the nearest FP8 E4M3FN value (ties to even), as float32.

    Arithmetic, not a cast: the interpreter's cast rounds ties away and flushes subnormals, and
    the same code then runs everywhere (FP8 storage needs no sm89 conversion instructions)."""
    a = tl.abs(y)
    exponent = (a.to(tl.int32, bitcast=True) >> 23) & 0xFF
    # Spacing of E4M3 values near a: 2^(e-3) in binade [2^e, 2^(e+1)); 2^-9 below 2^-6.
    step_field = tl.maximum(exponent - 3, 127 - 9)
    step = (step_field << 23).to(tl.float32, bitcast=True)
    # a / step as a product with the exact reciprocal 2^-(e-3): Triton compiles float32 `/`
    # to the GPU's approximate division (div.full.f32), which moved ties on an H200.
    inv_step = ((254 - step_field) << 23).to(tl.float32, bitcast=True)
    r = round_half_even(a * inv_step) * step  # products with powers of two: exact
    # y's sign bit put on r with integer operations: negating r lost the sign of -0.0 on an
    # H200 (a negative y that rounds to zero gave code 0x00 where the reference has 0x80).
    sign = (y.to(tl.int32, bitcast=True) >> 31) << 31
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def fp8_bits(r):
    """An E4M3FN value (float32, from _fp8_round) -> its code: sign, 4 exponent bits (bias 7),
    3 mantissa bits; below 2^-6 the code is r * 2^9 (subnormals and 2^-6 itself)."""
    bits = r.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.abs(r)
    a_bits = a.to(tl.int32, bitcast=True)
    normal = ((((a_bits >> 23) & 0xFF) - 120) << 3) | ((a_bits >> 20) & 7)
    subnormal = (a * 512.0).to(tl.int32)
    return tl.where(a < 0.015625, subnormal, normal) | sign


@triton.jit
def fp8_value(code):
    """E4M3FN code (int32 0..255) -> float32 value (the NaN codes, never written, read as 480)."""
    exponent = (code >> 3) & 15
    mantissa = code & 7
    power = ((exponent + 117) << 23).to(tl.float32, bitcast=True)  # 2^(exponent - 10)
    magnitude = tl.where(
        exponent == 0, mantissa.to(tl.float32) * 0.001953125, (8 + mantissa).to(tl.float32) * power
    )
    sign = (code & 0x80) << 24  # the sign bit set with integer operations, as in fp8_round
    return (magnitude.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def quantize(x, scale, CACHE_QUANT: tl.constexpr):
    """float32 values -> cache codes as float32 (exact in the cache dtype); identity unquantized."""
    y = x
    if CACHE_QUANT == 1:
        y = fp8_round(tl.minimum(tl.maximum(tl.div_rn(x, scale), -448.0), 448.0))
    elif CACHE_QUANT == 2:
        y = tl.minimum(tl.maximum(round_half_even(tl.div_rn(x, scale)), -127.0), 127.0)
    return y


@triton.jit
def store_codes(ptr, offsets, codes, mask, CACHE_QUANT: tl.constexpr):
    """Store quantized cache codes at ``ptr + offsets``: FP8 E4M3 as its uint8 bit pattern
    (``CACHE_QUANT`` 1), else converted to the cache's element type (int8)."""
    if CACHE_QUANT == 1:
        tl.store(ptr + offsets, fp8_bits(codes).to(tl.uint8), mask=mask)
    else:
        tl.store(ptr + offsets, codes.to(ptr.dtype.element_ty), mask=mask)
