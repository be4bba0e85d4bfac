/* o_g[0:16] += w * values for four output rows at once with AVX2, shared by decode.c and
 * prefill_tiles.c (static inline: it runs inside their innermost loops). */
#ifndef LLMC_PA_ACCUMULATE_AVX2_H
#define LLMC_PA_ACCUMULATE_AVX2_H

#include "attention_parts.h"

#ifdef LLMC_PA_AVX2
/* o_g[0:16] += sum_i w(i, g) * values_i[0:16] for four output rows g, with w(i, g) =
 * p[i * p_key + g * p_row]: the 8 accumulators stay in registers over all n value rows. Stores
 * go in reverse row order, so when spare rows alias one scratch row, o[0] is stored last. */
static inline void accumulate_4x16_avx2(float *const o[4], const float *restrict values,
                                        int64_t row_stride, int n, const float *restrict p,
                                        int64_t p_key, int64_t p_row) {
  __m256 c00 = _mm256_loadu_ps(o[0]), c01 = _mm256_loadu_ps(o[0] + 8);
  __m256 c10 = _mm256_loadu_ps(o[1]), c11 = _mm256_loadu_ps(o[1] + 8);
  __m256 c20 = _mm256_loadu_ps(o[2]), c21 = _mm256_loadu_ps(o[2] + 8);
  __m256 c30 = _mm256_loadu_ps(o[3]), c31 = _mm256_loadu_ps(o[3] + 8);
  for (int i = 0; i < n; ++i) {
    const float *v = values + i * row_stride, *pi = p + i * p_key;
    __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), w;
    w = _mm256_broadcast_ss(pi);
    c00 = _mm256_fmadd_ps(w, v0, c00);
    c01 = _mm256_fmadd_ps(w, v1, c01);
    w = _mm256_broadcast_ss(pi + p_row);
    c10 = _mm256_fmadd_ps(w, v0, c10);
    c11 = _mm256_fmadd_ps(w, v1, c11);
    w = _mm256_broadcast_ss(pi + 2 * p_row);
    c20 = _mm256_fmadd_ps(w, v0, c20);
    c21 = _mm256_fmadd_ps(w, v1, c21);
    w = _mm256_broadcast_ss(pi + 3 * p_row);
    c30 = _mm256_fmadd_ps(w, v0, c30);
    c31 = _mm256_fmadd_ps(w, v1, c31);
  }
  _mm256_storeu_ps(o[3], c30);
  _mm256_storeu_ps(o[3] + 8, c31);
  _mm256_storeu_ps(o[2], c20);
  _mm256_storeu_ps(o[2] + 8, c21);
  _mm256_storeu_ps(o[1], c10);
  _mm256_storeu_ps(o[1] + 8, c11);
  _mm256_storeu_ps(o[0], c00);
  _mm256_storeu_ps(o[0] + 8, c01);
}
#endif

#endif
