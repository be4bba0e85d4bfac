/* Prefill tiles on the CPU in float32: up to QUERY_ROWS / G consecutive new tokens of one
 * sequence times the G heads of their GQA group (llmc_pa_attend_tile), so that each K/V row read
 * from the paged cache serves every query row of the tile. Queries are transposed once per tile
 * so that scores come out one query row per lane; keys and values one tile at a time, the online
 * softmax in prefill_softmax.h. Portable C the compiler vectorizes, AVX2 and AVX-512 by hand
 * where the build targets them. */
#include <string.h>

#include "accumulate_avx2.h"
#include "attention_parts.h"
#include "prefill_softmax.h"

#ifdef LLMC_PA_AVX2
/* score_tile with AVX2 (QUERY_ROWS = 32: four vectors per key). Why by hand: as plain C the 4 keys
 * x 32 rows of sums spill; here two keys x 32 rows = 8 sums stay in registers, and each query
 * vector loaded serves both keys. */
static void score_tile_avx2(const float *restrict qt, int head_dim, const float *restrict keys,
                            int64_t row_stride, int n, float (*restrict s)[QUERY_ROWS]) {
  int i = 0;
  for (; i + 2 <= n; i += 2) {
    const float *k0 = keys + i * row_stride, *k1 = k0 + row_stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int d = 0; d < head_dim; ++d) {
      const float *qd = qt + d * QUERY_ROWS;
      __m256 q0 = _mm256_loadu_ps(qd), q1 = _mm256_loadu_ps(qd + 8);
      __m256 q2 = _mm256_loadu_ps(qd + 16), q3 = _mm256_loadu_ps(qd + 24);
      __m256 x = _mm256_broadcast_ss(k0 + d), y = _mm256_broadcast_ss(k1 + d);
      a0 = _mm256_fmadd_ps(x, q0, a0);
      a1 = _mm256_fmadd_ps(x, q1, a1);
      a2 = _mm256_fmadd_ps(x, q2, a2);
      a3 = _mm256_fmadd_ps(x, q3, a3);
      b0 = _mm256_fmadd_ps(y, q0, b0);
      b1 = _mm256_fmadd_ps(y, q1, b1);
      b2 = _mm256_fmadd_ps(y, q2, b2);
      b3 = _mm256_fmadd_ps(y, q3, b3);
    }
    _mm256_storeu_ps(s[i], a0);
    _mm256_storeu_ps(s[i] + 8, a1);
    _mm256_storeu_ps(s[i] + 16, a2);
    _mm256_storeu_ps(s[i] + 24, a3);
    _mm256_storeu_ps(s[i + 1], b0);
    _mm256_storeu_ps(s[i + 1] + 8, b1);
    _mm256_storeu_ps(s[i + 1] + 16, b2);
    _mm256_storeu_ps(s[i + 1] + 24, b3);
  }
  for (; i < n; ++i) {
    const float *key = keys + i * row_stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < head_dim; ++d) {
      const float *qd = qt + d * QUERY_ROWS;
      __m256 x = _mm256_broadcast_ss(key + d);
      a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(qd), a0);
      a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(qd + 8), a1);
      a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(qd + 16), a2);
      a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(qd + 24), a3);
    }
    _mm256_storeu_ps(s[i], a0);
    _mm256_storeu_ps(s[i] + 8, a1);
    _mm256_storeu_ps(s[i] + 16, a2);
    _mm256_storeu_ps(s[i] + 24, a3);
  }
}

/* qt[d * QUERY_ROWS + r0 + j] = rows[j][d] * scale for the 8 rows j of one group, head_dim % 8
 * == 0: 8 x 8 blocks transposed in registers instead of 64 scalar stores 128 bytes apart. */
static void transpose_rows8_avx2(const float *const *rows, int head_dim, float scale, int r0,
                                 float *restrict qt) {
  __m256 vscale = _mm256_set1_ps(scale);
  for (int d = 0; d < head_dim; d += 8) {
    __m256 x0 = _mm256_loadu_ps(rows[0] + d), x1 = _mm256_loadu_ps(rows[1] + d);
    __m256 x2 = _mm256_loadu_ps(rows[2] + d), x3 = _mm256_loadu_ps(rows[3] + d);
    __m256 x4 = _mm256_loadu_ps(rows[4] + d), x5 = _mm256_loadu_ps(rows[5] + d);
    __m256 x6 = _mm256_loadu_ps(rows[6] + d), x7 = _mm256_loadu_ps(rows[7] + d);
    __m256 t0 = _mm256_unpacklo_ps(x0, x1), t1 = _mm256_unpackhi_ps(x0, x1);
    __m256 t2 = _mm256_unpacklo_ps(x2, x3), t3 = _mm256_unpackhi_ps(x2, x3);
    __m256 t4 = _mm256_unpacklo_ps(x4, x5), t5 = _mm256_unpackhi_ps(x4, x5);
    __m256 t6 = _mm256_unpacklo_ps(x6, x7), t7 = _mm256_unpackhi_ps(x6, x7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    float *out = qt + (int64_t)d * QUERY_ROWS + r0;
    _mm256_storeu_ps(out + 0 * QUERY_ROWS, _mm256_mul_ps(_mm256_permute2f128_ps(u0, u4, 0x20), vscale));
    _mm256_storeu_ps(out + 1 * QUERY_ROWS, _mm256_mul_ps(_mm256_permute2f128_ps(u1, u5, 0x20), vscale));
    _mm256_storeu_ps(out + 2 * QUERY_ROWS, _mm256_mul_ps(_mm256_permute2f128_ps(u2, u6, 0x20), vscale));
    _mm256_storeu_ps(out + 3 * QUERY_ROWS, _mm256_mul_ps(_mm256_permute2f128_ps(u3, u7, 0x20), vscale));
    _mm256_storeu_ps(out + 4 * QUERY_ROWS, _mm256_mul_ps(_mm256_permute2f128_ps(u0, u4, 0x31), vscale));
    _mm256_storeu_ps(out + 5 * QUERY_ROWS, _mm256_mul_ps(_mm256_permute2f128_ps(u1, u5, 0x31), vscale));
    _mm256_storeu_ps(out + 6 * QUERY_ROWS, _mm256_mul_ps(_mm256_permute2f128_ps(u2, u6, 0x31), vscale));
    _mm256_storeu_ps(out + 7 * QUERY_ROWS, _mm256_mul_ps(_mm256_permute2f128_ps(u3, u7, 0x31), vscale));
  }
}

/* accumulate_tile with AVX2 for head_dim % 16 == 0: four rows x 16 columns of out at a time
 * (accumulate_4x16_avx2). */
static void accumulate_tile_avx2(const float (*restrict p)[QUERY_ROWS], int num_rows,
                                 const float *restrict values, int64_t row_stride, int n,
                                 int head_dim, float *const *rows) {
  float scratch[16] __attribute__((aligned(32))) = {0}; /* spare rows of a last partial group */
  for (int r = 0; r < num_rows; r += 4) {
    int m = num_rows - r < 4 ? num_rows - r : 4;
    for (int d = 0; d < head_dim; d += 16) {
      float *o[4];
      for (int g = 0; g < 4; ++g) o[g] = g < m ? rows[r + g] + d : scratch;
      accumulate_4x16_avx2(o, values + d, row_stride, n, p[0] + r, QUERY_ROWS, 1);
    }
  }
}
#endif

#ifdef LLMC_PA_AVX512
/* score_tile with AVX-512 (QUERY_ROWS = 32: two vectors per key): four keys x 32 rows = 8 sums
 * in registers, each query vector loaded serving four keys (AVX2: two). Each lane sums over d
 * in the same order as score_tile_avx2, so the scores are the same bits. */
static void score_tile_avx512(const float *restrict qt, int head_dim, const float *restrict keys,
                              int64_t row_stride, int n, float (*restrict s)[QUERY_ROWS]) {
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    const float *k0 = keys + i * row_stride, *k1 = k0 + row_stride;
    const float *k2 = k1 + row_stride, *k3 = k2 + row_stride;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, e0 = a0,
           e1 = a0;
    for (int d = 0; d < head_dim; ++d) {
      const float *qd = qt + d * QUERY_ROWS;
      __m512 q0 = _mm512_loadu_ps(qd), q1 = _mm512_loadu_ps(qd + 16);
      __m512 x = _mm512_set1_ps(k0[d]);
      a0 = _mm512_fmadd_ps(x, q0, a0);
      a1 = _mm512_fmadd_ps(x, q1, a1);
      x = _mm512_set1_ps(k1[d]);
      b0 = _mm512_fmadd_ps(x, q0, b0);
      b1 = _mm512_fmadd_ps(x, q1, b1);
      x = _mm512_set1_ps(k2[d]);
      c0 = _mm512_fmadd_ps(x, q0, c0);
      c1 = _mm512_fmadd_ps(x, q1, c1);
      x = _mm512_set1_ps(k3[d]);
      e0 = _mm512_fmadd_ps(x, q0, e0);
      e1 = _mm512_fmadd_ps(x, q1, e1);
    }
    _mm512_storeu_ps(s[i], a0);
    _mm512_storeu_ps(s[i] + 16, a1);
    _mm512_storeu_ps(s[i + 1], b0);
    _mm512_storeu_ps(s[i + 1] + 16, b1);
    _mm512_storeu_ps(s[i + 2], c0);
    _mm512_storeu_ps(s[i + 2] + 16, c1);
    _mm512_storeu_ps(s[i + 3], e0);
    _mm512_storeu_ps(s[i + 3] + 16, e1);
  }
  for (; i < n; ++i) {
    const float *key = keys + i * row_stride;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    for (int d = 0; d < head_dim; ++d) {
      const float *qd = qt + d * QUERY_ROWS;
      __m512 x = _mm512_set1_ps(key[d]);
      a0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(qd), a0);
      a1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(qd + 16), a1);
    }
    _mm512_storeu_ps(s[i], a0);
    _mm512_storeu_ps(s[i] + 16, a1);
  }
}

/* accumulate_4x16_avx2 on 32 columns: o_g[0:32] += sum_i p[i * p_key + g * p_row] * values_i
 * for four rows g, 8 accumulators of 16 lanes; the same sums in the same order. */
static inline void accumulate_4x32_avx512(float *const o[4], const float *restrict values,
                                          int64_t row_stride, int n, const float *restrict p,
                                          int64_t p_key, int64_t p_row) {
  __m512 c00 = _mm512_loadu_ps(o[0]), c01 = _mm512_loadu_ps(o[0] + 16);
  __m512 c10 = _mm512_loadu_ps(o[1]), c11 = _mm512_loadu_ps(o[1] + 16);
  __m512 c20 = _mm512_loadu_ps(o[2]), c21 = _mm512_loadu_ps(o[2] + 16);
  __m512 c30 = _mm512_loadu_ps(o[3]), c31 = _mm512_loadu_ps(o[3] + 16);
  for (int i = 0; i < n; ++i) {
    const float *v = values + i * row_stride, *pi = p + i * p_key;
    __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16), w;
    w = _mm512_set1_ps(pi[0]);
    c00 = _mm512_fmadd_ps(w, v0, c00);
    c01 = _mm512_fmadd_ps(w, v1, c01);
    w = _mm512_set1_ps(pi[p_row]);
    c10 = _mm512_fmadd_ps(w, v0, c10);
    c11 = _mm512_fmadd_ps(w, v1, c11);
    w = _mm512_set1_ps(pi[2 * p_row]);
    c20 = _mm512_fmadd_ps(w, v0, c20);
    c21 = _mm512_fmadd_ps(w, v1, c21);
    w = _mm512_set1_ps(pi[3 * p_row]);
    c30 = _mm512_fmadd_ps(w, v0, c30);
    c31 = _mm512_fmadd_ps(w, v1, c31);
  }
  _mm512_storeu_ps(o[3], c30);
  _mm512_storeu_ps(o[3] + 16, c31);
  _mm512_storeu_ps(o[2], c20);
  _mm512_storeu_ps(o[2] + 16, c21);
  _mm512_storeu_ps(o[1], c10);
  _mm512_storeu_ps(o[1] + 16, c11);
  _mm512_storeu_ps(o[0], c00);
  _mm512_storeu_ps(o[0] + 16, c01);
}

/* accumulate_tile_avx2 for head_dim % 32 == 0 with accumulate_4x32_avx512. */
static void accumulate_tile_avx512(const float (*restrict p)[QUERY_ROWS], int num_rows,
                                   const float *restrict values, int64_t row_stride, int n,
                                   int head_dim, float *const *rows) {
  float scratch[32] __attribute__((aligned(64))) = {0}; /* spare rows of a last partial group */
  for (int r = 0; r < num_rows; r += 4) {
    int m = num_rows - r < 4 ? num_rows - r : 4;
    for (int d = 0; d < head_dim; d += 32) {
      float *o[4];
      for (int g = 0; g < 4; ++g) o[g] = g < m ? rows[r + g] + d : scratch;
      accumulate_4x32_avx512(o, values + d, row_stride, n, p[0] + r, QUERY_ROWS, 1);
    }
  }
}
#endif

/* s[i][r] = key_i . qt[:, r] for n keys row_stride apart, qt being the tile's queries transposed
 * ([D][QUERY_ROWS], unused rows zero). Why transposed: each key element is broadcast against 32
 * queries with no horizontal sum, and the scores come out one query row per lane, the layout the
 * softmax of llmc_pa_attend_tile runs in. Why four keys per pass: 4 x 32 sums stay in registers. */
static void score_tile(const float *restrict qt, int head_dim, const float *restrict keys,
                       int64_t row_stride, int n, float (*restrict s)[QUERY_ROWS]) {
#ifdef LLMC_PA_AVX512
  if (QUERY_ROWS == 32) {
    score_tile_avx512(qt, head_dim, keys, row_stride, n, s);
    return;
  }
#endif
#ifdef LLMC_PA_AVX2
  if (QUERY_ROWS == 32) {
    score_tile_avx2(qt, head_dim, keys, row_stride, n, s);
    return;
  }
#endif
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    const float *k0 = keys + i * row_stride, *k1 = k0 + row_stride;
    const float *k2 = k1 + row_stride, *k3 = k2 + row_stride;
    float a0[QUERY_ROWS] = {0}, a1[QUERY_ROWS] = {0}, a2[QUERY_ROWS] = {0};
    float a3[QUERY_ROWS] = {0};
    for (int d = 0; d < head_dim; ++d) {
      const float *qd = qt + d * QUERY_ROWS;
      float x0 = k0[d], x1 = k1[d], x2 = k2[d], x3 = k3[d];
#pragma omp simd
      for (int r = 0; r < QUERY_ROWS; ++r) {
        a0[r] += x0 * qd[r];
        a1[r] += x1 * qd[r];
        a2[r] += x2 * qd[r];
        a3[r] += x3 * qd[r];
      }
    }
    memcpy(s[i], a0, sizeof a0);
    memcpy(s[i + 1], a1, sizeof a1);
    memcpy(s[i + 2], a2, sizeof a2);
    memcpy(s[i + 3], a3, sizeof a3);
  }
  for (; i < n; ++i) {
    const float *key = keys + i * row_stride;
    float a[QUERY_ROWS] = {0};
    for (int d = 0; d < head_dim; ++d) {
      const float *qd = qt + d * QUERY_ROWS;
      float x = key[d];
#pragma omp simd
      for (int r = 0; r < QUERY_ROWS; ++r) a[r] += x * qd[r];
    }
    memcpy(s[i], a, sizeof a);
  }
}

/* rows[r] += sum_i p[i][r] * value_i for the first num_rows rows, four rows and four values per
 * pass (as accumulate_values_4heads; the rows of a tile are not equally spaced in out). */
static void accumulate_tile(const float (*restrict p)[QUERY_ROWS], int num_rows,
                            const float *restrict values, int64_t row_stride, int n,
                            int head_dim, float *const *rows) {
#ifdef LLMC_PA_AVX512
  if (head_dim % 32 == 0) {
    accumulate_tile_avx512(p, num_rows, values, row_stride, n, head_dim, rows);
    return;
  }
#endif
#ifdef LLMC_PA_AVX2
  if (head_dim % 16 == 0) {
    accumulate_tile_avx2(p, num_rows, values, row_stride, n, head_dim, rows);
    return;
  }
#endif
  int r = 0;
  for (; r + 4 <= num_rows; r += 4) {
    float *restrict o0 = rows[r], *restrict o1 = rows[r + 1];
    float *restrict o2 = rows[r + 2], *restrict o3 = rows[r + 3];
    int i = 0;
    for (; i + 4 <= n; i += 4) {
      const float *v0 = values + i * row_stride, *v1 = v0 + row_stride;
      const float *v2 = v1 + row_stride, *v3 = v2 + row_stride;
      const float *p0 = p[i] + r, *p1 = p[i + 1] + r, *p2 = p[i + 2] + r, *p3 = p[i + 3] + r;
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) {
        o0[d] += p0[0] * v0[d] + p1[0] * v1[d] + p2[0] * v2[d] + p3[0] * v3[d];
        o1[d] += p0[1] * v0[d] + p1[1] * v1[d] + p2[1] * v2[d] + p3[1] * v3[d];
        o2[d] += p0[2] * v0[d] + p1[2] * v1[d] + p2[2] * v2[d] + p3[2] * v3[d];
        o3[d] += p0[3] * v0[d] + p1[3] * v1[d] + p2[3] * v2[d] + p3[3] * v3[d];
      }
    }
    for (; i < n; ++i) {
      const float *value = values + i * row_stride, *pi = p[i] + r;
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) {
        o0[d] += pi[0] * value[d];
        o1[d] += pi[1] * value[d];
        o2[d] += pi[2] * value[d];
        o3[d] += pi[3] * value[d];
      }
    }
  }
  for (; r < num_rows; ++r) {
    float *restrict o = rows[r];
    for (int i = 0; i < n; ++i) {
      const float *value = values + i * row_stride;
      float pi = p[i][r];
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) o[d] += pi * value[d];
    }
  }
}

/* num_queries consecutive tokens of one sequence, one GQA group (attention_parts.h). Row r of
 * the tile is token r / group, head r % group. Keys the union of the tokens' ranges holds but one
 * token may not see (past its position, before its window) are masked to -inf per row. */
void llmc_pa_attend_tile(const float *restrict q, int64_t q_stride, float *restrict out,
                         int64_t out_stride, const struct kv_view *kv,
                         const int32_t *restrict block_table, int block_size, int group,
                         int head_dim, int num_queries, int position, int sliding_window,
                         float scale, float softcap) {
  int num_rows = num_queries * group;
  int buffer_len = kv->dtype == PA_CACHE_F32 ? 1 : TILE * head_dim; /* decoded tile rows */
  float row_buffer[buffer_len]; /* a tile's keys, then its values */
  float qt[head_dim * QUERY_ROWS]; /* queries transposed and pre-scaled, see score_tile */
  float s[TILE][QUERY_ROWS];
  struct rows_state rows_state;
  float *rows[QUERY_ROWS];
  memset(qt, 0, sizeof qt);
  rows_state_init(&rows_state, group, num_queries, position, sliding_window);
  int transposed = 0; /* rows already in qt */
#ifdef LLMC_PA_AVX2
  if (head_dim % 8 == 0) {
    for (; transposed + 8 <= num_rows; transposed += 8) {
      const float *q_rows[8];
      for (int j = 0; j < 8; ++j) {
        int r = transposed + j;
        q_rows[j] = q + (r / group) * q_stride + (r % group) * head_dim;
      }
      transpose_rows8_avx2(q_rows, head_dim, scale, transposed, qt);
    }
  }
#endif
  for (int r = 0; r < num_rows; ++r) {
    const float *qr = q + (r / group) * q_stride + (r % group) * head_dim;
    if (r >= transposed) {
      for (int d = 0; d < head_dim; ++d) qt[d * QUERY_ROWS + r] = qr[d] * scale;
    }
    rows[r] = out + (r / group) * out_stride + (r % group) * head_dim;
    memset(rows[r], 0, sizeof(float) * head_dim);
  }

  int last = position + num_queries - 1;
  int first = rows_state.first[0] > 0 ? rows_state.first[0] : 0;
  for (int j0 = first; j0 <= last;) {
    int offset = j0 % block_size; /* a tile never crosses a block (see decode.c) */
    int n = block_size - offset;
    if (n > last - j0 + 1) n = last - j0 + 1;
    if (n > TILE) n = TILE;
    int64_t slot = (int64_t)block_table[j0 / block_size] * block_size + offset;
    int64_t stride;
    const float *rows_read = tile_rows(kv->keys, kv->dtype, kv->k_scale, slot, kv->row_stride,
                                       n, head_dim, row_buffer, &stride);
    score_tile(qt, head_dim, rows_read, stride, n, s);
    float weight = softmax_update(s, n, j0, position, &rows_state, softcap, rows, num_rows,
                                  head_dim);
    if (weight == 0.0f) { /* no row sees a key of this tile (windows) */
      j0 += n;
      continue;
    }
    rows_read = tile_rows(kv->values, kv->dtype, kv->v_scale, slot, kv->row_stride, n, head_dim,
                          row_buffer, &stride);
    accumulate_tile(s, num_rows, rows_read, stride, n, head_dim, rows);
    j0 += n;
  }
  for (int r = 0; r < num_rows; ++r) {
    float inv = 1.0f / rows_state.running_sum[r], *o = rows[r];
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) o[d] *= inv;
  }
}
