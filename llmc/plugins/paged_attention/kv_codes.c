/* The KV cache's codes: float32 to FP8 E4M3FN or int8 (the write, round half to even and
 * saturate) and back (the FP8 table), and the exported quantize / dequantize that cpu.py's
 * quantize_cpu and dequantize_cpu run on their own. A quantized cache holds
 * q = saturate(round_half_even(x / scale)) and is read as x = float(q) * scale. */
#include "kv_codes.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* float32 -> E4M3FN code: round to nearest even, saturating to +-448 (so no finite input, nor
 * an infinity, becomes NaN; NaN stays NaN). Branch-free selects, so that a row vectorizes. */
static inline uint8_t fp8_e4m3fn_from_float(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  uint32_t sign = (bits >> 24) & 0x80, magnitude = bits & 0x7FFFFFFF;
  /* Below 2^-6 (the smallest normal) the codes 0..8 are the multiples of 2^-9, code 8 being
   * 2^-6 itself: scaling by 2^9 is exact, and nearbyintf rounds half to even. */
  float small = magnitude < 0x3C800000u ? fabsf(x) * 0x1p9f : 0.0f;
  uint32_t subnormal = (uint32_t)nearbyintf(small);
  /* Normal: keep 3 of float32's 23 mantissa bits, adding just under half of the dropped unit
   * plus the kept lowest bit (ties to even); a carry moves into the exponent, as it should.
   * Rebias the exponent from 127 to 7: subtract 120 << 3 from the code. */
  uint32_t rounded = magnitude + 0x7FFFFu + ((magnitude >> 20) & 1u);
  uint32_t normal = (rounded >> 20) - (120u << 3);
  uint32_t code = magnitude < 0x3C800000u ? subnormal : normal;
  code = magnitude >= 0x43E00000u ? 0x7Eu : code; /* >= 448 (and +-inf): saturate to 448 */
  code = magnitude > 0x7F800000u ? 0x7Fu : code;  /* NaN */
  return (uint8_t)(sign | code);
}

/* E4M3FN code -> float32, exactly; for the table. */
static float fp8_e4m3fn_value(int code) {
  int exponent = (code >> 3) & 15, mantissa = code & 7;
  float magnitude = exponent == 0 ? ldexpf((float)mantissa, -9)
                                  : ldexpf((float)(8 + mantissa), exponent - 10);
  if (exponent == 15 && mantissa == 7) magnitude = NAN;
  return code & 0x80 ? -magnitude : magnitude;
}

float llmc_pa_fp8_e4m3fn_table[256];
static pthread_once_t fp8_table_once = PTHREAD_ONCE_INIT;

static void fill_fp8_table(void) {
  for (int code = 0; code < 256; ++code) llmc_pa_fp8_e4m3fn_table[code] = fp8_e4m3fn_value(code);
}

void llmc_pa_fp8_table_init(void) { pthread_once(&fp8_table_once, fill_fp8_table); }

/* float32 -> int8: round half to even, saturate to [-127, 127]; NaN becomes 127 (never produced
 * from finite input). Why comparisons, not fminf/fmaxf: GCC 12 vectorizes only these. */
static inline int8_t int8_from_float(float x) {
  x = !(x < 127.0f) ? 127.0f : x;
  x = x < -127.0f ? -127.0f : x;
  return (int8_t)(int32_t)nearbyintf(x);
}

void llmc_pa_encode_row(const float *restrict x, void *restrict dst, int64_t n, int dtype,
                        float scale) {
  if (dtype == PA_CACHE_FP8_E4M3FN) {
    uint8_t *restrict codes = dst;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) codes[i] = fp8_e4m3fn_from_float(x[i] / scale);
  } else if (dtype == PA_CACHE_INT8) {
    int8_t *restrict codes = dst;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) codes[i] = int8_from_float(x[i] / scale);
  } else {
    memcpy(dst, x, sizeof(float) * n);
  }
}

/* The write and read of the kernel, on their own for the tests (cpu.py's quantize_cpu). */
void llmc_pa_quantize(const float *x, void *out, int64_t n, int dtype, float scale) {
  llmc_pa_encode_row(x, out, n, dtype, scale);
}

void llmc_pa_dequantize(const void *codes, float *out, int64_t n, int dtype, float scale) {
  llmc_pa_fp8_table_init();
  if (dtype == PA_CACHE_F32) {
    memcpy(out, codes, sizeof(float) * n);
    return;
  }
  for (int64_t i = 0; i < n; i += 1 << 20) { /* one row per chunk: a row's length is an int */
    int chunk = n - i < (1 << 20) ? (int)(n - i) : 1 << 20;
    decode_rows((const uint8_t *)codes + i, dtype, scale, 0, 1, chunk, out + i);
  }
}
