/* How the CPU attention kernel's parts read and write a quantized KV cache (kv_codes.c): the
 * write (encode) once per new token, the read (decode) per tile inside the attention loops,
 * static inline here so that it stays inlined there. */
#ifndef LLMC_PA_KV_CODES_H
#define LLMC_PA_KV_CODES_H

#include <stddef.h>
#include <stdint.h>

#include "paged_attention.h"

/* All 256 E4M3FN values, filled by llmc_pa_fp8_table_init. Why a table: decoding is then one
 * load (a gather, vectorized); building the float32 bits with shifts and selects (subnormals
 * apart) measured far slower with GCC 12. */
__attribute__((visibility("hidden"))) extern float llmc_pa_fp8_e4m3fn_table[256];

/* Fill llmc_pa_fp8_e4m3fn_table, once per process; before the first FP8 read. */
__attribute__((visibility("hidden"))) void llmc_pa_fp8_table_init(void);

/* dst[i] = quantize(x[i] / scale) for n elements (a float32 cache: a copy, scale unused). */
__attribute__((visibility("hidden"))) void llmc_pa_encode_row(const float *restrict x,
                                                              void *restrict dst, int64_t n,
                                                              int dtype, float scale);

/* One layer's cache as one work item reads it: KV head kvh of slot 0 in `keys` / `values`. */
struct kv_view {
  const void *keys, *values;
  int64_t row_stride; /* elements from one slot's row to the next: KVH * D */
  int dtype;
  float k_scale, v_scale;
};

static inline size_t cache_itemsize(int dtype) { return dtype == PA_CACHE_F32 ? 4 : 1; }

/* dst[i][d] = float(src[i * row_stride + d]) * scale for n rows of head_dim elements of a
 * quantized cache; dst is packed ([n][head_dim]). */
static inline void decode_rows(const void *restrict src, int dtype, float scale,
                               int64_t row_stride, int n, int head_dim, float *restrict dst) {
  for (int i = 0; i < n; ++i) {
    float *restrict row = dst + (int64_t)i * head_dim;
    if (dtype == PA_CACHE_INT8) {
      const int8_t *restrict codes = (const int8_t *)src + i * row_stride;
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) row[d] = (float)codes[d] * scale;
    } else {
      const uint8_t *restrict codes = (const uint8_t *)src + i * row_stride;
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) row[d] = llmc_pa_fp8_e4m3fn_table[codes[d]] * scale;
    }
  }
}

/* Rows slot .. slot + n - 1 of one KV head as float32 rows *stride elements apart: where they
 * live for a float32 cache; else decoded into buf ([n][head_dim], see decode_rows). */
static inline const float *tile_rows(const void *cache, int dtype, float scale, int64_t slot,
                                     int64_t row_stride, int n, int head_dim,
                                     float *restrict buf, int64_t *stride) {
  if (dtype == PA_CACHE_F32) {
    *stride = row_stride;
    return (const float *)cache + slot * row_stride;
  }
  decode_rows((const uint8_t *)cache + slot * row_stride, dtype, scale, row_stride, n, head_dim,
              buf);
  *stride = head_dim;
  return buf;
}

#endif
