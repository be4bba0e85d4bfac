/* Decode on the CPU: one new token of a sequence against its context, all G query heads of one
 * GQA group at a time (llmc_pa_attend_group), walking the block table one tile of keys at a
 * time with the online softmax (Milakov & Gimelshein 2018, as tiled in FlashAttention, Dao et
 * al. 2022). Scalar C the compiler vectorizes, and AVX2 by hand where the build targets it. */
#include <math.h>
#include <string.h>

#include "../simd_math.h"
#include "accumulate_avx2.h"
#include "attention_parts.h"

/* Rows of the cache a tile loop will read next, to prefetch while it computes (see
 * llmc_pa_attend_group): `rows` rows of `row_bytes` bytes each, `stride_bytes` apart from
 * `base`; base NULL for none. */
struct prefetch_rows {
  const char *base;
  int64_t stride_bytes;
  int rows;
  int row_bytes;
};

/* Ask for rows [i, i + n) of `pf` (those that exist) to be brought into L2. Why in small
 * portions between computations rather than one burst per tile: a core tracks only a few dozen
 * outstanding misses, and a burst of hundreds stalls it instead of overlapping the loads. Why L2
 * (locality 2, prefetcht1) and not L1: a tile's key rows being scored and its value rows being
 * prefetched are two tiles of TILE rows of head_dim floats, 32 KB each at head_dim 256 -- more
 * than a 32 KB L1 holds, so rows prefetched into L1 evicted each other before they were read.
 * Measured on an AMD EPYC Zen 4 (32 KB L1, one core, 16 sequences x 192 tokens x 18 layers of
 * a float32 cache from memory): 10.7 ms into L1, 6.7 ms into L2, 13.8 ms without prefetching.
 * On a Zen 3 with AVX2 the kernel waits on its arithmetic and L1 was up to 7% faster there:
 * about 1% of a decode step, not worth a second path (benchmarks/RESULTS.md). */
static inline void prefetch_rows(const struct prefetch_rows *pf, int i, int n) {
  if (pf->base == NULL) return;
  for (int r = i; r < i + n && r < pf->rows; ++r) {
    const char *row = pf->base + r * pf->stride_bytes;
    for (int b = 0; b < pf->row_bytes; b += 64) __builtin_prefetch(row + b, 0, 2);
  }
}

/* scores[i] = q . key_i for n keys row_stride apart. Why four keys per pass: four independent
 * sums hide the FMA latency that one reduction chain would wait on, and q is loaded once. */
static void score_keys(const float *restrict q, const float *restrict keys, int64_t row_stride,
                       int n, int head_dim, float *restrict scores) {
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    const float *k0 = keys + i * row_stride, *k1 = k0 + row_stride;
    const float *k2 = k1 + row_stride, *k3 = k2 + row_stride;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int d = 0; d < head_dim; ++d) {
      s0 += q[d] * k0[d];
      s1 += q[d] * k1[d];
      s2 += q[d] * k2[d];
      s3 += q[d] * k3[d];
    }
    scores[i] = s0;
    scores[i + 1] = s1;
    scores[i + 2] = s2;
    scores[i + 3] = s3;
  }
  for (; i < n; ++i) {
    const float *key = keys + i * row_stride;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < head_dim; ++d) s += q[d] * key[d];
    scores[i] = s;
  }
}

/* acc += sum_i p[i] * value_i. Why four values per pass: acc is loaded and stored once per four
 * rows instead of once per row. */
static void accumulate_values(const float *restrict p, const float *restrict values,
                              int64_t row_stride, int n, int head_dim, float *restrict acc) {
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    const float *v0 = values + i * row_stride, *v1 = v0 + row_stride;
    const float *v2 = v1 + row_stride, *v3 = v2 + row_stride;
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) {
      acc[d] += p[i] * v0[d] + p[i + 1] * v1[d] + p[i + 2] * v2[d] + p[i + 3] * v3[d];
    }
  }
  for (; i < n; ++i) {
    const float *value = values + i * row_stride;
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) acc[d] += p[i] * value[d];
  }
}

#ifdef LLMC_PA_AVX2

/* score_keys_4heads with AVX2 for head_dim % 8 == 0. Why by hand: as plain C, GCC keeps 16
 * vector sums for 4 keys x 4 heads plus the loads in 16 registers only by spilling, and reduces
 * each sum on its own. Here: two keys x four heads = 8 sums in registers (plus 2 key and 1 query
 * vector), and the 8 sums reduced together by a tree of horizontal adds. */
static void score_keys_4heads_avx2(const float *restrict q, int head_dim,
                                   const float *restrict keys, int64_t row_stride, int n,
                                   float (*restrict scores)[TILE],
                                   const struct prefetch_rows *pf) {
  int i = 0;
  for (; i + 2 <= n; i += 2) {
    if ((i & 3) == 0) prefetch_rows(pf, i, 4);
    const float *k0 = keys + i * row_stride, *k1 = k0 + row_stride;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
    __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    for (int d = 0; d < head_dim; d += 8) {
      __m256 x0 = _mm256_loadu_ps(k0 + d), x1 = _mm256_loadu_ps(k1 + d), y;
      y = _mm256_loadu_ps(q + d);
      a00 = _mm256_fmadd_ps(y, x0, a00);
      a01 = _mm256_fmadd_ps(y, x1, a01);
      y = _mm256_loadu_ps(q + head_dim + d);
      a10 = _mm256_fmadd_ps(y, x0, a10);
      a11 = _mm256_fmadd_ps(y, x1, a11);
      y = _mm256_loadu_ps(q + 2 * head_dim + d);
      a20 = _mm256_fmadd_ps(y, x0, a20);
      a21 = _mm256_fmadd_ps(y, x1, a21);
      y = _mm256_loadu_ps(q + 3 * head_dim + d);
      a30 = _mm256_fmadd_ps(y, x0, a30);
      a31 = _mm256_fmadd_ps(y, x1, a31);
    }
    /* hadd(hadd(a_g0, a_g1), hadd(a_h0, a_h1)) holds the four sums' halves of lanes 0-3 in the
     * low 128 bits and of lanes 4-7 in the high: adding the halves gives
     * [g0k0 g0k1 g1k0 g1k1 g2k0 g2k1 g3k0 g3k1]. */
    __m256 h01 = _mm256_hadd_ps(_mm256_hadd_ps(a00, a01), _mm256_hadd_ps(a10, a11));
    __m256 h23 = _mm256_hadd_ps(_mm256_hadd_ps(a20, a21), _mm256_hadd_ps(a30, a31));
    __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(h01, h23, 0x20),
                                _mm256_permute2f128_ps(h01, h23, 0x31));
    float out[8];
    _mm256_storeu_ps(out, sums);
    for (int g = 0; g < 4; ++g) {
      scores[g][i] = out[2 * g];
      scores[g][i + 1] = out[2 * g + 1];
    }
  }
  prefetch_rows(pf, i, pf->rows - i);
  for (int g = 0; g < 4 && i < n; ++g) {
    score_keys(q + g * head_dim, keys + i * row_stride, row_stride, n - i, head_dim,
               scores[g] + i);
  }
}

/* One decode tile's softmax update for one head, without soft-cap: s[i] *= scale; returns the
 * new running max m = max(running_max, s) and sets s[i] = exp(s[i] - m), *sum = sum of them. */
static inline float softmax_tile_avx2(float *restrict s, int n, float scale, float running_max,
                                      float *sum) {
  __m256 vscale = _mm256_set1_ps(scale), vmax = _mm256_set1_ps(running_max);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + i), vscale);
    _mm256_storeu_ps(s + i, x);
    vmax = _mm256_max_ps(vmax, x);
  }
  float m[8];
  _mm256_storeu_ps(m, vmax);
  float tile_max = m[0];
  for (int j = 1; j < 8; ++j) tile_max = m[j] > tile_max ? m[j] : tile_max;
  for (int j = i; j < n; ++j) {
    s[j] *= scale;
    tile_max = s[j] > tile_max ? s[j] : tile_max;
  }
  __m256 vsum = _mm256_setzero_ps(), vm = _mm256_set1_ps(tile_max);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 e = llmc_exp_nonpositive_trunc8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
    _mm256_storeu_ps(s + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float parts[8], total = 0.0f;
  _mm256_storeu_ps(parts, vsum);
  for (int j = 0; j < 8; ++j) total += parts[j];
  for (; i < n; ++i) {
    s[i] = llmc_exp_nonpositive_trunc(s[i] - tile_max);
    total += s[i];
  }
  *sum = total;
  return tile_max;
}

/* accumulate_values_4heads with AVX2 for head_dim % 16 == 0: for each 16 columns, the four
 * heads' accumulators stay in registers over all n value rows, so acc is read and written once
 * per tile instead of once per four rows. */
static void accumulate_values_4heads_avx2(float (*restrict p)[TILE],
                                          const float *restrict values, int64_t row_stride,
                                          int n, int head_dim, float *restrict acc,
                                          const struct prefetch_rows *pf) {
  for (int d = 0; d < head_dim; d += 16) {
    prefetch_rows(pf, d / 16, 1); /* one row per 16 columns: spread over the tile */
    float *o[4] = {acc + d, acc + head_dim + d, acc + 2 * head_dim + d, acc + 3 * head_dim + d};
    accumulate_4x16_avx2(o, values + d, row_stride, n, p[0], 1, TILE);
  }
  prefetch_rows(pf, head_dim / 16, pf->rows - head_dim / 16);
}
#endif

/* score_keys for four heads at once (q holds them D apart). Why: each key element loaded feeds
 * four multiply-adds instead of one, so the loop is bound by FMAs rather than by loads. */
static void score_keys_4heads(const float *restrict q, int head_dim, const float *restrict keys,
                              int64_t row_stride, int n, float (*restrict scores)[TILE],
                              const struct prefetch_rows *pf) {
#ifdef LLMC_PA_AVX2
  if (head_dim % 8 == 0) {
    score_keys_4heads_avx2(q, head_dim, keys, row_stride, n, scores, pf);
    return;
  }
#endif
  const float *q0 = q, *q1 = q + head_dim, *q2 = q + 2 * head_dim, *q3 = q + 3 * head_dim;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    prefetch_rows(pf, i, 4);
    const float *k0 = keys + i * row_stride, *k1 = k0 + row_stride;
    const float *k2 = k1 + row_stride, *k3 = k2 + row_stride;
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
    float c0 = 0, c1 = 0, c2 = 0, c3 = 0, e0 = 0, e1 = 0, e2 = 0, e3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, e0, e1, e2, e3)
    for (int d = 0; d < head_dim; ++d) {
      a0 += q0[d] * k0[d]; a1 += q0[d] * k1[d]; a2 += q0[d] * k2[d]; a3 += q0[d] * k3[d];
      b0 += q1[d] * k0[d]; b1 += q1[d] * k1[d]; b2 += q1[d] * k2[d]; b3 += q1[d] * k3[d];
      c0 += q2[d] * k0[d]; c1 += q2[d] * k1[d]; c2 += q2[d] * k2[d]; c3 += q2[d] * k3[d];
      e0 += q3[d] * k0[d]; e1 += q3[d] * k1[d]; e2 += q3[d] * k2[d]; e3 += q3[d] * k3[d];
    }
    float *s0 = scores[0] + i, *s1 = scores[1] + i, *s2 = scores[2] + i, *s3 = scores[3] + i;
    s0[0] = a0; s0[1] = a1; s0[2] = a2; s0[3] = a3;
    s1[0] = b0; s1[1] = b1; s1[2] = b2; s1[3] = b3;
    s2[0] = c0; s2[1] = c1; s2[2] = c2; s2[3] = c3;
    s3[0] = e0; s3[1] = e1; s3[2] = e2; s3[3] = e3;
  }
  prefetch_rows(pf, i, pf->rows - i);
  for (int g = 0; g < 4 && i < n; ++g) {
    score_keys(q + g * head_dim, keys + i * row_stride, row_stride, n - i, head_dim,
               scores[g] + i);
  }
}

/* accumulate_values for four heads at once (acc holds them D apart), for the same reason. */
static void accumulate_values_4heads(float (*restrict p)[TILE], const float *restrict values,
                                     int64_t row_stride, int n, int head_dim,
                                     float *restrict acc, const struct prefetch_rows *pf) {
#ifdef LLMC_PA_AVX2
  if (head_dim % 16 == 0) {
    accumulate_values_4heads_avx2(p, values, row_stride, n, head_dim, acc, pf);
    return;
  }
#endif
  float *acc0 = acc, *acc1 = acc + head_dim, *acc2 = acc + 2 * head_dim;
  float *acc3 = acc + 3 * head_dim;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    prefetch_rows(pf, i, 4);
    const float *v0 = values + i * row_stride, *v1 = v0 + row_stride;
    const float *v2 = v1 + row_stride, *v3 = v2 + row_stride;
    const float *p0 = p[0] + i, *p1 = p[1] + i, *p2 = p[2] + i, *p3 = p[3] + i;
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) {
      acc0[d] += p0[0] * v0[d] + p0[1] * v1[d] + p0[2] * v2[d] + p0[3] * v3[d];
      acc1[d] += p1[0] * v0[d] + p1[1] * v1[d] + p1[2] * v2[d] + p1[3] * v3[d];
      acc2[d] += p2[0] * v0[d] + p2[1] * v1[d] + p2[2] * v2[d] + p2[3] * v3[d];
      acc3[d] += p3[0] * v0[d] + p3[1] * v1[d] + p3[2] * v2[d] + p3[3] * v3[d];
    }
  }
  prefetch_rows(pf, i, pf->rows - i);
  for (int g = 0; g < 4 && i < n; ++g) {
    accumulate_values(p[g] + i, values + i * row_stride, row_stride, n - i, head_dim,
                      acc + g * head_dim);
  }
}

/* One token, one GQA group (attention_parts.h). */
void llmc_pa_attend_group(const float *restrict q, float *restrict out, const struct kv_view *kv,
                          const int32_t *restrict block_table, int block_size, int group,
                          int head_dim, int first, int last, float scale, float softcap) {
  float running_max[group], running_sum[group], scores[group][TILE];
  int buffer_len = kv->dtype == PA_CACHE_F32 ? 1 : TILE * head_dim; /* decoded tile rows */
  float key_buffer[buffer_len], value_buffer[buffer_len];
  for (int g = 0; g < group; ++g) {
    running_max[g] = -INFINITY;
    running_sum[g] = 0.0f;
  }
  memset(out, 0, sizeof(float) * group * head_dim);

  for (int j0 = first; j0 <= last;) {
    /* A tile never crosses a block: its rows are then equally spaced in memory. */
    int offset = j0 % block_size;
    int n = block_size - offset;
    if (n > last - j0 + 1) n = last - j0 + 1;
    if (n > TILE) n = TILE;
    int64_t slot = (int64_t)block_table[j0 / block_size] * block_size + offset;
    int64_t key_stride, value_stride;
    const float *keys = tile_rows(kv->keys, kv->dtype, kv->k_scale, slot, kv->row_stride, n,
                                  head_dim, key_buffer, &key_stride);
    const float *values = tile_rows(kv->values, kv->dtype, kv->v_scale, slot, kv->row_stride,
                                    n, head_dim, value_buffer, &value_stride);
    /* Prefetch, spread over the tile's computation: its value rows while the keys are scored,
     * the next tile's key rows while the values are summed. Why: a decode reads each row once,
     * and a tile's rows come from one block of 16-32 KB whose first lines are otherwise waited
     * for. A quantized cache's rows were decoded above already. */
    int64_t row_bytes = kv->row_stride * (int64_t)cache_itemsize(kv->dtype);
    int line_bytes = head_dim * (int)cache_itemsize(kv->dtype);
    struct prefetch_rows pf_values = {NULL, row_bytes, n, line_bytes};
    struct prefetch_rows pf_keys = {NULL, row_bytes, 0, line_bytes};
    if (kv->dtype == PA_CACHE_F32) pf_values.base = (const char *)kv->values + slot * row_bytes;
    int j1 = j0 + n;
    if (j1 <= last) {
      int next_offset = j1 % block_size, next_n = block_size - next_offset;
      if (next_n > last - j1 + 1) next_n = last - j1 + 1;
      if (next_n > TILE) next_n = TILE;
      int64_t next_slot = (int64_t)block_table[j1 / block_size] * block_size + next_offset;
      pf_keys.base = (const char *)kv->keys + next_slot * row_bytes;
      pf_keys.rows = next_n;
    }

    /* Why all G heads over one tile, four at a time where G allows: the tile's K and V rows
     * come from memory once and stay in L1 while the group's heads reuse them. */
    int g = 0;
    for (; g + 4 <= group; g += 4) {
      score_keys_4heads(q + g * head_dim, head_dim, keys, key_stride, n, scores + g, &pf_values);
    }
    for (; g < group; ++g) score_keys(q + g * head_dim, keys, key_stride, n, head_dim, scores[g]);
#ifdef LLMC_PA_AVX2
    if (softcap <= 0.0f) {
      for (g = 0; g < group; ++g) {
        float tile_sum;
        float tile_max = softmax_tile_avx2(scores[g], n, scale, running_max[g], &tile_sum);
        float correction = expf(running_max[g] - tile_max);
        if (correction != 1.0f) {
          float *og = out + g * head_dim;
#pragma omp simd
          for (int d = 0; d < head_dim; ++d) og[d] *= correction;
        }
        running_sum[g] = running_sum[g] * correction + tile_sum;
        running_max[g] = tile_max;
      }
      goto values;
    }
#endif
    for (g = 0; g < group; ++g) {
      for (int i = 0; i < n; ++i) {
        float s = scores[g][i] * scale;
        scores[g][i] = softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
      }
    }
    for (g = 0; g < group; ++g) {
      float tile_max = running_max[g];
      for (int i = 0; i < n; ++i) tile_max = scores[g][i] > tile_max ? scores[g][i] : tile_max;
      /* The first tile has running_max = -inf: correction = exp(-inf) = 0 on a zero sum. */
      float correction = expf(running_max[g] - tile_max);
      if (correction != 1.0f) {
        float *og = out + g * head_dim;
#pragma omp simd
        for (int d = 0; d < head_dim; ++d) og[d] *= correction;
      }
      float tile_sum = 0.0f;
#pragma omp simd reduction(+ : tile_sum)
      for (int i = 0; i < n; ++i) {
        scores[g][i] = llmc_exp_nonpositive_trunc(scores[g][i] - tile_max);
        tile_sum += scores[g][i];
      }
      running_sum[g] = running_sum[g] * correction + tile_sum;
      running_max[g] = tile_max;
    }
#ifdef LLMC_PA_AVX2
  values:
#endif
    for (g = 0; g + 4 <= group; g += 4) {
      accumulate_values_4heads(scores + g, values, value_stride, n, head_dim,
                               out + g * head_dim, &pf_keys);
    }
    for (; g < group; ++g) {
      accumulate_values(scores[g], values, value_stride, n, head_dim, out + g * head_dim);
    }
    j0 += n;
  }
  for (int g = 0; g < group; ++g) {
    float inv = 1.0f / running_sum[g];
    float *og = out + g * head_dim;
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) og[d] *= inv;
  }
}
