/* The online softmax of a prefill tile's QUERY_ROWS query rows, shared by the float32 tiles
 * (prefill_tiles.c) and the AMX-BF16 tiles (prefill_amx.c): per row its visible context
 * positions and its running max and sum; per tile of keys the masked, soft-capped update.
 * static inline (softmax_update always inlined): it runs once per tile inside their loops. */
#ifndef LLMC_PA_PREFILL_SOFTMAX_H
#define LLMC_PA_PREFILL_SOFTMAX_H

#include <math.h>

#include "../simd_math.h"
#include "attention_parts.h"

/* The online-softmax state of a prefill tile's QUERY_ROWS rows: each row's visible context
 * positions [first, last] and its running max and sum. */
struct rows_state {
  int first[QUERY_ROWS], last[QUERY_ROWS];
  float running_max[QUERY_ROWS], running_sum[QUERY_ROWS];
};

/* Rows of num_queries tokens x group heads from `position` on (spare rows past num_queries *
 * group take the last token's range, are computed and never written), nothing seen yet. */
static inline void rows_state_init(struct rows_state *st, int group, int num_queries,
                                   int position, int sliding_window) {
  for (int r = 0; r < QUERY_ROWS; ++r) {
    int token = r < num_queries * group ? r / group : num_queries - 1;
    st->last[r] = position + token;
    st->first[r] = sliding_window > 0 ? st->last[r] - sliding_window + 1 : 0;
    st->running_max[r] = -INFINITY;
    st->running_sum[r] = 0.0f;
  }
}

/* One tile's online-softmax update: s[i][r] (keys j0 + i, i < n) soft-capped, masked to what
 * row r may see, replaced by exp(s - new max); the running max and sum updated, and the first
 * num_rows accumulator rows (head_dim floats each) rescaled where the max grew. Returns the
 * tile's total weight (0: no row sees any of its keys). */
static inline __attribute__((always_inline)) float softmax_update(
    float (*restrict s)[QUERY_ROWS], int n, int j0, int position, struct rows_state *st,
    float softcap, float *const *rows, int num_rows, int head_dim) {
  float tile_max[QUERY_ROWS], tile_sum[QUERY_ROWS], correction[QUERY_ROWS];
  float *running_max = st->running_max, *running_sum = st->running_sum;
  if (softcap > 0.0f) {
    for (int i = 0; i < n; ++i) {
      for (int r = 0; r < QUERY_ROWS; ++r) s[i][r] = softcap * tanhf(s[i][r] / softcap);
    }
  }
  /* Only tiles that reach past the first token's position or before the last one's window
   * hold keys some row must not see. */
  if (j0 + n - 1 > position || j0 < st->first[QUERY_ROWS - 1]) {
    for (int i = 0; i < n; ++i) {
#pragma omp simd
      for (int r = 0; r < QUERY_ROWS; ++r) {
        int visible = j0 + i >= st->first[r] && j0 + i <= st->last[r];
        s[i][r] = visible ? s[i][r] : -INFINITY;
      }
    }
  }
#pragma omp simd
  for (int r = 0; r < QUERY_ROWS; ++r) {
    tile_max[r] = running_max[r];
    tile_sum[r] = 0.0f;
  }
  for (int i = 0; i < n; ++i) {
#pragma omp simd
    for (int r = 0; r < QUERY_ROWS; ++r) {
      tile_max[r] = s[i][r] > tile_max[r] ? s[i][r] : tile_max[r];
    }
  }
  /* A masked key weighs exactly 0, also in a row that has seen no key yet (max -inf, where
   * the exp below is of NaN). weight and num_corrected let whole steps be skipped; why scalar
   * sums also matter: GCC 12 vectorizes these loops with a reduction clause, not without. */
  float weight = 0.0f;
#if defined(LLMC_PA_AVX2) && QUERY_ROWS % 8 == 0
  /* by hand: GCC 12 leaves this loop scalar where llmc_pa_attend_tile_amx inlines it */
  for (int r = 0; r < QUERY_ROWS; r += 8) {
    __m256 m = _mm256_loadu_ps(tile_max + r), sum = _mm256_setzero_ps();
    for (int i = 0; i < n; ++i) {
      __m256 x = _mm256_loadu_ps(&s[i][r]);
      __m256 p = llmc_exp_nonpositive_trunc8(_mm256_sub_ps(x, m));
      p = _mm256_and_ps(p, _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_GT_OQ));
      _mm256_storeu_ps(&s[i][r], p);
      sum = _mm256_add_ps(sum, p);
    }
    _mm256_storeu_ps(tile_sum + r, sum);
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    for (int l = 0; l < 8; ++l) weight += lanes[l];
  }
#else
  for (int i = 0; i < n; ++i) {
#pragma omp simd reduction(+ : weight)
    for (int r = 0; r < QUERY_ROWS; ++r) {
      float p = llmc_exp_nonpositive_trunc(s[i][r] - tile_max[r]);
      p = s[i][r] == -INFINITY ? 0.0f : p;
      s[i][r] = p;
      tile_sum[r] += p;
      weight += p;
    }
  }
#endif
  /* -inf - -inf is NaN, which the exp clamps to ~0: it scales a zero sum either way. */
  float num_corrected = 0.0f; /* float and "< 1": the forms GCC 12 vectorizes (<= 1 always) */
#pragma omp simd reduction(+ : num_corrected)
  for (int r = 0; r < QUERY_ROWS; ++r) {
    correction[r] = llmc_exp_nonpositive_trunc(running_max[r] - tile_max[r]);
    running_sum[r] = running_sum[r] * correction[r] + tile_sum[r];
    running_max[r] = tile_max[r];
    num_corrected += correction[r] < 1.0f ? 1.0f : 0.0f;
  }
  for (int r = 0; r < num_rows && num_corrected > 0.0f; ++r) {
    if (correction[r] != 1.0f) {
      float *o = rows[r];
      float c = correction[r];
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) o[d] *= c;
    }
  }
  return weight;
}

#endif
