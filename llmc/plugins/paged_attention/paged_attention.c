/* llmc::PagedAttention on the CPU, float32 (DESIGN §3; the ground truth is reference.py).
 *
 * One call = one layer of one step: write the T new tokens' keys and values into the paged cache
 * in place, then let every new token attend causally over its sequence's context by walking the
 * block table. No copy of the cache and no gather of the context: each K/V row is read where it
 * lives. Scores use the online softmax of Milakov & Gimelshein 2018 ("Online normalizer
 * calculation for softmax") as tiled in FlashAttention (Dao et al. 2022): a running max and sum
 * per query head, the accumulator rescaled when the max grows, one tile of keys at a time.
 *
 * Built by setup.py as llmc/plugins/paged_attention/_paged_attention_cpu*.so (no PyInit: loaded
 * with ctypes by cpu.py), or by cpu.py itself with gcc when the extension is missing.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef LLMC_PA_SOURCE_SHA256
#define LLMC_PA_SOURCE_SHA256 "unknown"
#endif

/* Keys per softmax update. Why tiles: the accumulator is rescaled once per tile, not per key;
 * why 32: a tile's K and V rows (32 KB each at D=256, one KV head) stay close to L1. */
#define TILE 32

/* Below this many q.k multiply-adds (~10 us on one core) a step runs on the calling thread. Why:
 * waking the OpenMP team costs about as much, and far more when the cores are busy. */
#define PARALLEL_MIN_WORK (1 << 18)

enum {
  PA_OK = 0,
  PA_BAD_QUERY_START_LOC = 1, /* not 0 .. T, or decreasing */
  PA_BAD_SEQ_LEN = 2,         /* shorter than its new tokens, or longer than its block table */
  PA_BAD_BLOCK_ID = 3,        /* a block id the context uses is outside the cache */
  PA_BAD_SLOT = 4,            /* a slot outside the cache */
};

/* Lets cpu.py tell a stale built extension from one built from the current source. */
const char *llmc_pa_source_sha256(void) { return LLMC_PA_SOURCE_SHA256; }

static int check_metadata(const int32_t *seq_lens, const int32_t *query_start_loc,
                          const int32_t *block_tables, int64_t block_table_stride, int max_blocks,
                          const int64_t *slot_mapping, int num_tokens, int num_seqs,
                          int64_t num_blocks, int block_size) {
  if (query_start_loc[0] != 0 || query_start_loc[num_seqs] != num_tokens) {
    return PA_BAD_QUERY_START_LOC;
  }
  for (int b = 0; b < num_seqs; ++b) {
    int num_new = query_start_loc[b + 1] - query_start_loc[b];
    if (num_new < 0) return PA_BAD_QUERY_START_LOC;
    if (num_new == 0) continue; /* a sequence without new tokens is never read */
    if (seq_lens[b] < num_new || seq_lens[b] > (int64_t)max_blocks * block_size) {
      return PA_BAD_SEQ_LEN;
    }
    const int32_t *row = block_tables + b * block_table_stride;
    for (int i = 0; i < (seq_lens[b] + block_size - 1) / block_size; ++i) {
      if (row[i] < 0 || row[i] >= num_blocks) return PA_BAD_BLOCK_ID;
    }
  }
  for (int t = 0; t < num_tokens; ++t) {
    if (slot_mapping[t] < 0 || slot_mapping[t] >= num_blocks * block_size) return PA_BAD_SLOT;
  }
  return PA_OK;
}

/* The sequence that owns packed token t: the last b with query_start_loc[b] <= t. */
static int seq_of_token(const int32_t *query_start_loc, int num_seqs, int t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (query_start_loc[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/* exp(x) for x <= 0, vectorizable (libm's expf is a scalar call): x = n ln2 + r with Cody-Waite
 * range reduction, exp(r) by the Cephes expf polynomial (relative error < 1e-7, measured on
 * [-80, 0]), 2^n built in the exponent bits. Below -87 it returns ~2^-126 instead of 0, which
 * the softmax sum cannot tell apart. */
static inline float exp_nonpositive(float x) {
  x = x > -87.0f ? x : -87.0f;
  float n = (float)(int)(x * 1.44269504088896341f - 0.5f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
  return p * two_n.f;
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

/* score_keys for four heads at once (q holds them D apart). Why: each key element loaded feeds
 * four multiply-adds instead of one, so the loop is bound by FMAs rather than by loads. */
static void score_keys_4heads(const float *restrict q, int head_dim, const float *restrict keys,
                              int64_t row_stride, int n, float (*restrict scores)[TILE]) {
  const float *q0 = q, *q1 = q + head_dim, *q2 = q + 2 * head_dim, *q3 = q + 3 * head_dim;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
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
  for (int g = 0; g < 4 && i < n; ++g) {
    score_keys(q + g * head_dim, keys + i * row_stride, row_stride, n - i, head_dim,
               scores[g] + i);
  }
}

/* accumulate_values for four heads at once (acc holds them D apart), for the same reason. */
static void accumulate_values_4heads(float (*restrict p)[TILE], const float *restrict values,
                                     int64_t row_stride, int n, int head_dim,
                                     float *restrict acc) {
  float *acc0 = acc, *acc1 = acc + head_dim, *acc2 = acc + 2 * head_dim;
  float *acc3 = acc + 3 * head_dim;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
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
  for (int g = 0; g < 4 && i < n; ++g) {
    accumulate_values(p[g] + i, values + i * row_stride, row_stride, n - i, head_dim,
                      acc + g * head_dim);
  }
}

/* One token, one GQA group: the G query heads that share KV head kvh, over context positions
 * first..last. q and out point at the group's G*D contiguous floats; out is the accumulator.
 * key_cache/value_cache point at KV head kvh of slot 0; a slot's row is row_stride floats. */
static void attend_group(const float *restrict q, float *restrict out,
                         const float *restrict key_cache, const float *restrict value_cache,
                         const int32_t *restrict block_table, int64_t row_stride, int block_size,
                         int group, int head_dim, int first, int last, float scale,
                         float softcap) {
  float running_max[group], running_sum[group], scores[group][TILE];
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
    const float *keys = key_cache + slot * row_stride;
    const float *values = value_cache + slot * row_stride;

    /* Why all G heads over one tile, four at a time where G allows: the tile's K and V rows
     * come from memory once and stay in L1 while the group's heads reuse them. */
    int g = 0;
    for (; g + 4 <= group; g += 4) {
      score_keys_4heads(q + g * head_dim, head_dim, keys, row_stride, n, scores + g);
    }
    for (; g < group; ++g) score_keys(q + g * head_dim, keys, row_stride, n, head_dim, scores[g]);
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
        scores[g][i] = exp_nonpositive(scores[g][i] - tile_max);
        tile_sum += scores[g][i];
      }
      running_sum[g] = running_sum[g] * correction + tile_sum;
      running_max[g] = tile_max;
    }
    for (g = 0; g + 4 <= group; g += 4) {
      accumulate_values_4heads(scores + g, values, row_stride, n, head_dim, out + g * head_dim);
    }
    for (; g < group; ++g) {
      accumulate_values(scores[g], values, row_stride, n, head_dim, out + g * head_dim);
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

/* Returns PA_OK, or a PA_BAD_* code before anything is written. Strides are in elements.
 * sliding_window <= 0 and softcap <= 0 mean off. */
int llmc_paged_attention_f32(const float *q, int64_t q_stride, const float *k, int64_t k_stride,
                             const float *v, int64_t v_stride, float *key_cache,
                             float *value_cache, int64_t num_blocks, int block_size,
                             const int32_t *seq_lens, const int32_t *query_start_loc,
                             const int32_t *block_tables, int64_t block_table_stride,
                             int max_blocks, const int64_t *slot_mapping, float *out,
                             int num_tokens, int num_seqs, int num_heads, int num_kv_heads,
                             int head_dim, float scale, int sliding_window, float softcap) {
  int status = check_metadata(seq_lens, query_start_loc, block_tables, block_table_stride,
                              max_blocks, slot_mapping, num_tokens, num_seqs, num_blocks,
                              block_size);
  if (status != PA_OK) return status;

  int64_t row_stride = (int64_t)num_kv_heads * head_dim;
  for (int t = 0; t < num_tokens; ++t) {
    memcpy(key_cache + slot_mapping[t] * row_stride, k + t * k_stride, sizeof(float) * row_stride);
    memcpy(value_cache + slot_mapping[t] * row_stride, v + t * v_stride,
           sizeof(float) * row_stride);
  }

  /* Why (token, KV head) work items rather than (sequence, head): a single prefill with MQA is
   * one sequence and one KV head, which would leave every core but one idle; per token it is
   * T items. Dynamic scheduling because items differ in cost (a prefill's later tokens see more
   * context; decodes of long and short sequences mix). */
  int group = num_heads / num_kv_heads;
  int64_t num_items = (int64_t)num_tokens * num_kv_heads;
  int64_t work = 0; /* multiply-adds of q.k, an upper bound (windows ignored) */
  for (int b = 0; b < num_seqs; ++b) {
    work += (int64_t)(query_start_loc[b + 1] - query_start_loc[b]) * seq_lens[b];
  }
  work *= (int64_t)num_heads * head_dim;
#pragma omp parallel for schedule(dynamic, 1) if (work >= PARALLEL_MIN_WORK)
  for (int64_t item = 0; item < num_items; ++item) {
    int t = (int)(item / num_kv_heads), kvh = (int)(item % num_kv_heads);
    int b = seq_of_token(query_start_loc, num_seqs, t);
    int num_new = query_start_loc[b + 1] - query_start_loc[b];
    int position = seq_lens[b] - num_new + (t - query_start_loc[b]);
    int first = 0;
    if (sliding_window > 0 && position - sliding_window + 1 > 0) {
      first = position - sliding_window + 1;
    }
    int64_t head_offset = (int64_t)kvh * group * head_dim;
    float *out_group = out + (int64_t)t * num_heads * head_dim + head_offset;
    attend_group(q + t * q_stride + head_offset, out_group, key_cache + (int64_t)kvh * head_dim,
                 value_cache + (int64_t)kvh * head_dim, block_tables + b * block_table_stride,
                 row_stride, block_size, group, head_dim, first, position, scale, softcap);
  }
  return PA_OK;
}
