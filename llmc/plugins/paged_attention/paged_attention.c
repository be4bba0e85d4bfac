/* llmc::PagedAttention on the CPU: float32 activations, a float32, FP8 E4M3FN or int8 KV cache
 * (DESIGN §3; the ground truth is reference.py).
 *
 * One call = one layer of one step: write the T new tokens' keys and values into the paged cache
 * in place, then let every new token attend causally over its sequence's context by walking the
 * block table. No copy of the cache and no gather of the context: each K/V row is read where it
 * lives. Scores use the online softmax of Milakov & Gimelshein 2018 ("Online normalizer
 * calculation for softmax") as tiled in FlashAttention (Dao et al. 2022): a running max and sum
 * per query head, the accumulator rescaled when the max grows, one tile of keys at a time.
 *
 * Activations are float32; the cache is float32, FP8 E4M3FN or int8 (--kv-cache-dtype). A
 * quantized cache holds q = saturate(round_half_even(x / scale)) with one scale per layer for
 * keys and one for values (vLLM's per-tensor k_scale / v_scale); a tile of it is decoded to
 * float32 rows, x = float(q) * scale, when it is read, and every computation after that is the
 * float32 path's. A float32 cache is read in place, as before.
 *
 * Built by setup.py as llmc/plugins/paged_attention/_paged_attention_cpu*.so (no PyInit: loaded
 * with ctypes by cpu.py), or by cpu.py itself with gcc when the extension is missing.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "paged_attention.h"

#ifndef LLMC_PA_SOURCE_SHA256
#define LLMC_PA_SOURCE_SHA256 "unknown"
#endif

/* Keys per softmax update. Why tiles: the accumulator is rescaled once per tile, not per key;
 * why 32: a tile's K and V rows (32 KB each at D=256, one KV head) stay close to L1. */
#define TILE 32

/* Below this many q.k multiply-adds (~10 us on one core) a step runs on the calling thread. Why:
 * waking the worker threads costs about as much, and far more when the cores are busy. */
#define PARALLEL_MIN_WORK (1 << 18)

/* ---- Worker threads ----------------------------------------------------------------------
 * Why not OpenMP: the kernel runs between two ONNX Runtime segments, once per layer, and ORT's
 * pool runs next on the same cores. An OpenMP team spin-waits after its region unless
 * OMP_WAIT_POLICY=passive was set before the process loaded libgomp -- and torch, usually
 * imported first, loads the same libgomp. Spinning workers starved ORT (measured on 2 cores: a
 * 16-sequence Gemma 3 270M decode step took ~200 ms instead of ~110 ms). These workers sleep on a
 * condition variable between calls, whatever the environment, and take items from an atomic
 * counter (dynamic scheduling). One pool per process, started on first use. */
typedef llmc_pa_item_fn item_fn;

static struct {
  pthread_once_t once;
  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  int num_workers;
  int64_t generation; /* bumped per parallel call; workers run each generation once */
  int pending;        /* workers not yet finished with the current generation */
  item_fn fn;
  const void *ctx;
  int64_t num_items, next;
} pool = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER};

static void run_items(item_fn fn, const void *ctx, int64_t num_items) {
  for (int64_t i; (i = __atomic_fetch_add(&pool.next, 1, __ATOMIC_RELAXED)) < num_items;)
    fn(ctx, i);
}

static void *worker(void *arg) {
  (void)arg;
  int64_t seen = 0;
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    while (pool.generation == seen) pthread_cond_wait(&pool.wake, &pool.lock);
    seen = pool.generation;
    item_fn fn = pool.fn;
    const void *ctx = pool.ctx;
    int64_t n = pool.num_items;
    pthread_mutex_unlock(&pool.lock);
    run_items(fn, ctx, n);
    pthread_mutex_lock(&pool.lock);
    if (--pool.pending == 0) pthread_cond_signal(&pool.done);
  }
  return NULL;
}

/* Threads: LLMC_NUM_THREADS, else OMP_NUM_THREADS, else the online cores; the caller is one. */
static void start_pool(void) {
  const char *env = getenv("LLMC_NUM_THREADS");
  if (env == NULL) env = getenv("OMP_NUM_THREADS");
  long threads = env != NULL ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
  if (threads < 1) threads = 1;
  for (long i = 1; i < threads; ++i) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, NULL) != 0) break;
    pthread_detach(thread);
    pool.num_workers++;
  }
}

/* fn(ctx, i) for i in [0, num_items), on the caller and the workers; returns when all are done. */
static void parallel_for(item_fn fn, const void *ctx, int64_t num_items, int parallel) {
  pthread_once(&pool.once, start_pool);
  if (!parallel || pool.num_workers == 0 || num_items < 2) {
    for (int64_t i = 0; i < num_items; ++i) fn(ctx, i);
    return;
  }
  pthread_mutex_lock(&pool.lock);
  pool.fn = fn;
  pool.ctx = ctx;
  pool.num_items = num_items;
  pool.next = 0;
  pool.pending = pool.num_workers;
  pool.generation++;
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.lock);
  run_items(fn, ctx, num_items);
  pthread_mutex_lock(&pool.lock);
  while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.lock);
  pthread_mutex_unlock(&pool.lock);
}

/* ---- KV cache quantization --------------------------------------------------------------- */

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

/* E4M3FN code -> float32, exactly; for the table below. */
static float fp8_e4m3fn_value(int code) {
  int exponent = (code >> 3) & 15, mantissa = code & 7;
  float magnitude = exponent == 0 ? ldexpf((float)mantissa, -9)
                                  : ldexpf((float)(8 + mantissa), exponent - 10);
  if (exponent == 15 && mantissa == 7) magnitude = NAN;
  return code & 0x80 ? -magnitude : magnitude;
}

/* All 256 E4M3FN values. Why a table: decoding is then one load (a gather, vectorized); building
 * the float32 bits with shifts and selects (subnormals apart) measured far slower with GCC 12. */
static float fp8_e4m3fn_table[256];
static pthread_once_t fp8_table_once = PTHREAD_ONCE_INIT;

static void fill_fp8_table(void) {
  for (int code = 0; code < 256; ++code) fp8_e4m3fn_table[code] = fp8_e4m3fn_value(code);
}

/* float32 -> int8: round half to even, saturate to [-127, 127]; NaN becomes 127 (never produced
 * from finite input). Why comparisons, not fminf/fmaxf: GCC 12 vectorizes only these. */
static inline int8_t int8_from_float(float x) {
  x = !(x < 127.0f) ? 127.0f : x;
  x = x < -127.0f ? -127.0f : x;
  return (int8_t)(int32_t)nearbyintf(x);
}

/* dst[i] = quantize(x[i] / scale) for n elements (a float32 cache: a copy, scale unused). */
static void encode_row(const float *restrict x, void *restrict dst, int64_t n, int dtype,
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

/* dst[i][d] = float(src[i * row_stride + d]) * scale for n rows of head_dim elements of a
 * quantized cache; dst is packed ([n][head_dim]). */
static void decode_rows(const void *restrict src, int dtype, float scale, int64_t row_stride,
                        int n, int head_dim, float *restrict dst) {
  for (int i = 0; i < n; ++i) {
    float *restrict row = dst + (int64_t)i * head_dim;
    if (dtype == PA_CACHE_INT8) {
      const int8_t *restrict codes = (const int8_t *)src + i * row_stride;
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) row[d] = (float)codes[d] * scale;
    } else {
      const uint8_t *restrict codes = (const uint8_t *)src + i * row_stride;
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) row[d] = fp8_e4m3fn_table[codes[d]] * scale;
    }
  }
}

/* One layer's cache as one work item reads it: KV head kvh of slot 0 in `keys` / `values`. */
struct kv_view {
  const void *keys, *values;
  int64_t row_stride; /* elements from one slot's row to the next: KVH * D */
  int dtype;
  float k_scale, v_scale;
};

static inline size_t cache_itemsize(int dtype) { return dtype == PA_CACHE_F32 ? 4 : 1; }

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

/* Rows of the cache a tile loop will read next, to prefetch while it computes (see
 * attend_group): `rows` rows of `row_bytes` bytes each, `stride_bytes` apart from `base`; base
 * NULL for none. */
struct prefetch_rows {
  const char *base;
  int64_t stride_bytes;
  int rows;
  int row_bytes;
};

/* Ask for rows [i, i + n) of `pf` (those that exist) to be brought into the cache. Why in small
 * portions between computations rather than one burst per tile: a core tracks only a few dozen
 * outstanding misses, and a burst of hundreds stalls it instead of overlapping the loads. */
static inline void prefetch_rows(const struct prefetch_rows *pf, int i, int n) {
  if (pf->base == NULL) return;
  for (int r = i; r < i + n && r < pf->rows; ++r) {
    const char *row = pf->base + r * pf->stride_bytes;
    for (int b = 0; b < pf->row_bytes; b += 64) __builtin_prefetch(row + b, 0, 3);
  }
}

/* The write and read of the kernel, on their own for the tests (cpu.py's quantize_cpu). */
void llmc_pa_quantize(const float *x, void *out, int64_t n, int dtype, float scale) {
  encode_row(x, out, n, dtype, scale);
}

void llmc_pa_dequantize(const void *codes, float *out, int64_t n, int dtype, float scale) {
  pthread_once(&fp8_table_once, fill_fp8_table);
  if (dtype == PA_CACHE_F32) {
    memcpy(out, codes, sizeof(float) * n);
    return;
  }
  for (int64_t i = 0; i < n; i += 1 << 20) { /* one row per chunk: a row's length is an int */
    int chunk = n - i < (1 << 20) ? (int)(n - i) : 1 << 20;
    decode_rows((const uint8_t *)codes + i, dtype, scale, 0, 1, chunk, out + i);
  }
}

/* Lets cpu.py tell a stale built extension from one built from the current source. */
const char *llmc_pa_source_sha256(void) { return LLMC_PA_SOURCE_SHA256; }

const char *llmc_pa_status_message(int status) {
  switch (status) {
    case PA_BAD_QUERY_START_LOC:
      return "query_start_loc must start at 0, end at num_tokens and never decrease";
    case PA_BAD_SEQ_LEN:
      return "every seq_lens[b] must be at least its sequence's new-token count and fit its "
             "block table";
    case PA_BAD_BLOCK_ID:
      return "block_tables holds a block id outside [0, num_blocks) within a sequence's context";
    case PA_BAD_SLOT:
      return "slot_mapping holds a slot outside [0, num_blocks * block_size)";
    case PA_BAD_CACHE_DTYPE:
      return "the cache dtype code is not one the kernel knows";
    default:
      return "unknown status";
  }
}

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

/* The sequence that owns packed item t (a token, a tile) given each sequence's first item: the
 * last b with starts[b] <= t. */
static int seq_of(const int32_t *starts, int num_seqs, int t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (starts[mid] <= t) lo = mid; else hi = mid - 1;
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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LLMC_PA_AVX2 1

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

/* exp_nonpositive on 8 lanes: the same reduction, polynomial and clamp, lane by lane. */
static inline __m256 exp_nonpositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  __m256i ni = _mm256_cvttps_epi32(
      _mm256_sub_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f)));
  __m256 n = _mm256_cvtepi32_ps(ni);
  __m256 r = _mm256_add_ps(_mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x),
                           _mm256_mul_ps(n, _mm256_set1_ps(2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  __m256 two_n = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(p, two_n);
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
    __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
    _mm256_storeu_ps(s + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float parts[8], total = 0.0f;
  _mm256_storeu_ps(parts, vsum);
  for (int j = 0; j < 8; ++j) total += parts[j];
  for (; i < n; ++i) {
    s[i] = exp_nonpositive(s[i] - tile_max);
    total += s[i];
  }
  *sum = total;
  return tile_max;
}

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

/* One token, one GQA group: the G query heads that share KV head kvh, over context positions
 * first..last. q and out point at the group's G*D contiguous floats; out is the accumulator.
 * kv views KV head kvh of the cache. */
static void attend_group(const float *restrict q, float *restrict out,
                         const struct kv_view *kv, const int32_t *restrict block_table,
                         int block_size, int group, int head_dim, int first, int last,
                         float scale, float softcap) {
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
        scores[g][i] = exp_nonpositive(scores[g][i] - tile_max);
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

/* Query rows of a prefill tile: QUERY_ROWS / G tokens of one sequence times the G heads of their
 * GQA group. Why 32: per key the scores of 32 rows fill four 256-bit registers (two of 512), and
 * a tile of 8 Gemma 3 tokens (G = 4) reuses each K/V row read from the paged cache 32 times
 * instead of 4, while the masked triangle on the diagonal stays small. */
#define QUERY_ROWS 32

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

#if defined(LLMC_PA_AVX2) && defined(__AVX512F__)
#define LLMC_PA_AVX512 1
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
 * softmax of attend_tile runs in. Why four keys per pass: 4 x 32 sums stay in registers. */
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

/* The online-softmax state of a prefill tile's QUERY_ROWS rows: each row's visible context
 * positions [first, last] and its running max and sum. */
struct rows_state {
  int first[QUERY_ROWS], last[QUERY_ROWS];
  float running_max[QUERY_ROWS], running_sum[QUERY_ROWS];
};

/* Rows of num_queries tokens x group heads from `position` on (spare rows past num_queries *
 * group take the last token's range, are computed and never written), nothing seen yet. */
static void rows_state_init(struct rows_state *st, int group, int num_queries, int position,
                            int sliding_window) {
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
  /* by hand: GCC 12 leaves this loop scalar where attend_tile_amx inlines it */
  for (int r = 0; r < QUERY_ROWS; r += 8) {
    __m256 m = _mm256_loadu_ps(tile_max + r), sum = _mm256_setzero_ps();
    for (int i = 0; i < n; ++i) {
      __m256 x = _mm256_loadu_ps(&s[i][r]);
      __m256 p = exp_nonpositive8(_mm256_sub_ps(x, m));
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
      float p = exp_nonpositive(s[i][r] - tile_max[r]);
      p = s[i][r] == -INFINITY ? 0.0f : p;
      s[i][r] = p;
      tile_sum[r] += p;
      weight += p;
    }
  }
#endif
  /* -inf - -inf is NaN, which exp_nonpositive clamps to ~0: it scales a zero sum either way. */
  float num_corrected = 0.0f; /* float and "< 1": the forms GCC 12 vectorizes (<= 1 always) */
#pragma omp simd reduction(+ : num_corrected)
  for (int r = 0; r < QUERY_ROWS; ++r) {
    correction[r] = exp_nonpositive(running_max[r] - tile_max[r]);
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

/* num_queries consecutive tokens of one sequence (2 <= num_queries, num_queries * group <=
 * QUERY_ROWS), one GQA group: attend_group for all of them at once, so that each K/V row read
 * from the cache serves every query row of the tile. The first token sits at `position`; token i
 * reads q + i * q_stride and writes out + i * out_stride (G*D floats each). Row r of the tile is
 * token r / group, head r % group. Keys the union of the tokens' ranges holds but one token may
 * not see (past its position, before its window) are masked to -inf per row. */
static void attend_tile(const float *restrict q, int64_t q_stride, float *restrict out,
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
    int offset = j0 % block_size; /* as in attend_group: a tile never crosses a block */
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

/* ---- Prefill tiles on AMX-BF16 --------------------------------------------------------------
 * attend_tile with both products on Intel AMX's bf16 tiles (tdpbf16ps: a 16 x 32 bf16 tile times
 * a 32 x 16 one, pairs of the inner dimension side by side, into 16 x 16 float32), for nodes
 * whose fpmath_mode allows bf16 compute: q, k, the softmax weights and v rounded to bfloat16
 * (round to nearest even), every sum in float32, the softmax itself in float32 as above. Why:
 * one tdpbf16ps does 16x the multiply-adds of an AVX-512 FMA, and a 128-token prefill spends
 * most of the float32 path's time in those products. Keys go 32 at a time (two bf16 pairs
 * deep for the second product), gathered across cache blocks into a bf16 copy:
 *   scores: S^T [32 keys][32 rows] = K [keys][D] . Q^T, with Q^T packed once per tile as the
 *     B operand ([D / 2][32 rows][2]), so the keys need no transpose and the scores come out in
 *     the [key][row] layout softmax_update takes;
 *   values: O [32 rows][D] += P [rows][32 keys] . V, P transposed from the softmax's layout, V
 *     packed as [keys / 2][D][2]; O lives in a float32 buffer the tiles load and store.
 * All eight tiles are 16 rows x 64 bytes. Method: Intel's AMX programming reference
 * (tdpbf16ps, tile configuration), as in oneDNN's bf16 attention; the online softmax is
 * FlashAttention's (Dao et al. 2022). */
#if defined(LLMC_PA_AVX512) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__AVX512BF16__) && defined(__linux__)
#define LLMC_PA_AMX 1
#include "../amx_tiles.h"

#define AMX_KEYS 32    /* keys per chunk */
#define AMX_MAX_D 256 /* the largest head_dim the buffers hold */

static int amx_bf16_granted;
static pthread_once_t amx_bf16_once = PTHREAD_ONCE_INIT;

static void ask_for_amx_bf16(void) {
  amx_bf16_granted = llmc_amx_request(LLMC_AMX_TILE | LLMC_AMX_BF16);
}

static int amx_bf16_available(void) {
  pthread_once(&amx_bf16_once, ask_for_amx_bf16);
  return amx_bf16_granted;
}

/* r[0..15] (16 x 16 32-bit elements) transposed in place. */
static inline void transpose16_epi32(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  /* u[4g + k], 128-bit lane L: column 4L + k of rows 4g .. 4g + 3 */
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    __m512i ab_lo = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44);
    __m512i ab_hi = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
    __m512i cd_lo = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
    __m512i cd_hi = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
    r[k] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0x88);
    r[4 + k] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0xDD);
    r[8 + k] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0x88);
    r[12 + k] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0xDD);
  }
}

/* 16 bf16 pairs (lo[i], hi[i]) as 32-bit elements, lo in the low half: VNNI order. */
static inline __m512i bf16_pairs(__m512 lo, __m512 hi) {
  __m512i l = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(lo));
  __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(hi));
  return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
}

/* dst[0 .. n) = bf16(src[0 .. n)), n % 32 == 0. */
static inline void to_bf16(const float *restrict src, uint16_t *restrict dst, int n) {
  for (int d = 0; d < n; d += 32) {
    __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + d + 16), _mm512_loadu_ps(src + d));
    _mm512_storeu_si512(dst + d, (__m512i)b);
  }
}

/* attend_tile's contract and result (to bf16 rounding), head_dim % 32 == 0 and <= AMX_MAX_D,
 * on the AMX tiles of a host amx_bf16_available() granted. */
static void attend_tile_amx(const float *restrict q, int64_t q_stride, float *restrict out,
                            int64_t out_stride, const struct kv_view *kv,
                            const int32_t *restrict block_table, int block_size, int group,
                            int head_dim, int num_queries, int position, int sliding_window,
                            float scale, float softcap) {
  const int num_rows = num_queries * group, pairs = head_dim / 2;
  int buffer_len = kv->dtype == PA_CACHE_F32 ? 1 : AMX_KEYS * head_dim; /* decoded rows */
  float row_buffer[buffer_len];
  /* Q^T as the B operand: [row tile][d pair][16 rows] */
  uint32_t qv[2][AMX_MAX_D / 2][16] __attribute__((aligned(64)));
  uint16_t kb[AMX_KEYS][AMX_MAX_D] __attribute__((aligned(64)));        /* K, bf16 rows */
  uint32_t vb[AMX_KEYS / 2][AMX_MAX_D] __attribute__((aligned(64)));    /* V: [key pair][d] */
  uint32_t pa[QUERY_ROWS][AMX_KEYS / 2] __attribute__((aligned(64)));   /* P: [row][key pair] */
  float o[QUERY_ROWS][AMX_MAX_D] __attribute__((aligned(64)));
  float s[AMX_KEYS][QUERY_ROWS] __attribute__((aligned(64)));
  struct rows_state rows_state;
  float *rows[QUERY_ROWS];
  rows_state_init(&rows_state, group, num_queries, position, sliding_window);
  const __m512 vscale = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
  for (int rt = 0; rt < 2; ++rt) {
    for (int c = 0; c < pairs / 16; ++c) { /* 32 dims = 16 pairs of 16 rows, transposed */
      __m512i m[16];
      for (int j = 0; j < 16; ++j) {
        int r = rt * 16 + j;
        if (r < num_rows) {
          const float *qr = q + (r / group) * q_stride + (r % group) * head_dim + c * 32;
          m[j] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_loadu_ps(qr + 16), vscale),
                                              _mm512_mul_ps(_mm512_loadu_ps(qr), vscale));
        } else {
          m[j] = _mm512_setzero_si512();
        }
      }
      transpose16_epi32(m);
      for (int e = 0; e < 16; ++e) _mm512_store_si512(qv[rt][c * 16 + e], m[e]);
    }
  }
  for (int r = 0; r < QUERY_ROWS; ++r) {
    rows[r] = o[r];
    memset(o[r], 0, sizeof(float) * head_dim);
  }
  llmc_amx_configure();

  int last = position + num_queries - 1;
  int first = rows_state.first[0] > 0 ? rows_state.first[0] : 0;
  for (int j0 = first; j0 <= last; j0 += AMX_KEYS) {
    int n = last - j0 + 1 < AMX_KEYS ? last - j0 + 1 : AMX_KEYS;
    /* the chunk's keys as bf16 rows and its value rows' addresses, block by block (a quantized
     * cache's values decoded into row_buffer once the keys are converted); zeros past n */
    const float *v_rows[AMX_KEYS];
    for (int pass = 0; pass < 2; ++pass) {
      const void *cache = pass == 0 ? kv->keys : kv->values;
      float cache_scale = pass == 0 ? kv->k_scale : kv->v_scale;
      for (int i = 0; i < n;) {
        int j = j0 + i, offset = j % block_size;
        int run = block_size - offset < n - i ? block_size - offset : n - i;
        int64_t slot = (int64_t)block_table[j / block_size] * block_size + offset, stride;
        float *decoded = kv->dtype == PA_CACHE_F32 ? NULL : row_buffer + (int64_t)i * head_dim;
        const float *r = tile_rows(cache, kv->dtype, cache_scale, slot, kv->row_stride, run,
                                   head_dim, decoded, &stride);
        for (int x = 0; x < run; ++x) {
          if (pass == 0)
            to_bf16(r + x * stride, kb[i + x], head_dim);
          else
            v_rows[i + x] = r + x * stride;
        }
        i += run;
      }
    }
    for (int pair = 0; pair < (n + 1) / 2; ++pair) {
      const float *v0 = v_rows[2 * pair], *v1 = 2 * pair + 1 < n ? v_rows[2 * pair + 1] : NULL;
      for (int d = 0; d < head_dim; d += 16) {
        __m512 hi = v1 == NULL ? zero : _mm512_loadu_ps(v1 + d);
        _mm512_store_si512(&vb[pair][d], bf16_pairs(_mm512_loadu_ps(v0 + d), hi));
      }
    }
    for (int key = n; key < AMX_KEYS; ++key) memset(kb[key], 0, sizeof(uint16_t) * head_dim);
    for (int pair = (n + 1) / 2; pair < AMX_KEYS / 2; ++pair)
      memset(vb[pair], 0, sizeof(uint32_t) * head_dim);

    /* S^T [32 keys][32 rows]: tiles 0-3 (key tile x row tile), K in 4-5, Q^T in 6-7 */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int c = 0; c < pairs / 16; ++c) {
      _tile_loadd(4, &kb[0][c * 32], sizeof kb[0]);
      _tile_loadd(5, &kb[16][c * 32], sizeof kb[0]);
      _tile_loadd(6, qv[0][c * 16], 64);
      _tile_loadd(7, qv[1][c * 16], 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, &s[0][0], sizeof s[0]);
    _tile_stored(1, &s[0][16], sizeof s[0]);
    _tile_stored(2, &s[16][0], sizeof s[0]);
    _tile_stored(3, &s[16][16], sizeof s[0]);

    float weight = softmax_update(s, n, j0, position, &rows_state, softcap, rows, num_rows,
                                  head_dim);
    if (weight == 0.0f) continue; /* no row sees a key of this chunk (windows) */
    for (int key = n; key < AMX_KEYS; ++key) memset(s[key], 0, sizeof s[key]);

    /* P [rows][32 keys] bf16: pairs of keys per row, transposed from s's [key][row] */
    for (int rt = 0; rt < 2; ++rt) {
      __m512i m[16];
      for (int pair = 0; pair < 16; ++pair)
        m[pair] = bf16_pairs(_mm512_load_ps(&s[2 * pair][rt * 16]),
                             _mm512_load_ps(&s[2 * pair + 1][rt * 16]));
      transpose16_epi32(m);
      for (int j = 0; j < 16; ++j) _mm512_store_si512(pa[rt * 16 + j], m[j]);
    }
    /* O += P . V: P's row tiles in 4-5, V's 16 columns in 6, O's tiles through 0-1 */
    _tile_loadd(4, pa[0], 64);
    _tile_loadd(5, pa[16], 64);
    for (int dt = 0; dt < head_dim / 16; ++dt) {
      _tile_loadd(6, &vb[0][dt * 16], sizeof vb[0]);
      _tile_loadd(0, &o[0][dt * 16], sizeof o[0]);
      _tile_loadd(1, &o[16][dt * 16], sizeof o[0]);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 5, 6);
      _tile_stored(0, &o[0][dt * 16], sizeof o[0]);
      _tile_stored(1, &o[16][dt * 16], sizeof o[0]);
    }
  }
  for (int r = 0; r < num_rows; ++r) {
    float inv = 1.0f / rows_state.running_sum[r];
    float *dst = out + (r / group) * out_stride + (r % group) * head_dim;
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) dst[d] = o[r][d] * inv;
  }
}
#endif

/* Whether fpmath_mode PA_FPMATH_BF16 runs prefill tiles on AMX-BF16 here (built for it and
 * granted the tiles), for cpu.py and the tests. */
int llmc_pa_amx_bf16(void) {
#ifdef LLMC_PA_AMX
  return amx_bf16_available();
#else
  return 0;
#endif
}

/* Everything one work item needs: the arguments of llmc_paged_attention_on plus the tiling. */
struct step_ctx {
  const float *q;
  int64_t q_stride;
  float *out;
  const void *key_cache, *value_cache;
  int cache_dtype;
  float k_scale, v_scale;
  const int32_t *seq_lens, *query_start_loc, *block_tables;
  int64_t block_table_stride;
  const int32_t *tile_start;
  int num_seqs, num_heads, num_kv_heads, head_dim, group, tile_tokens;
  int64_t row_stride;
  int block_size, sliding_window;
  float scale, softcap;
  int64_t num_items;
  int amx_bf16; /* prefill tiles on attend_tile_amx */
};

/* Work item `index` (issued last tile first, see the caller): one tile of one sequence's new
 * tokens against one KV head. */
static void attend_item(const void *context, int64_t index) {
  const struct step_ctx *c = context;
  int64_t item = c->num_items - 1 - index;
  int tile = (int)(item / c->num_kv_heads), kvh = (int)(item % c->num_kv_heads);
  int b = seq_of(c->tile_start, c->num_seqs, tile);
  int t = c->query_start_loc[b] + (tile - c->tile_start[b]) * c->tile_tokens;
  int left = c->query_start_loc[b + 1] - t;
  int num_queries = left < c->tile_tokens ? left : c->tile_tokens;
  int position = c->seq_lens[b] - left;
  int group = c->group, head_dim = c->head_dim;
  int64_t head_offset = (int64_t)kvh * group * head_dim;
  const float *q_group = c->q + t * c->q_stride + head_offset;
  float *out_group = c->out + (int64_t)t * c->num_heads * head_dim + head_offset;
  size_t head_bytes = (size_t)kvh * head_dim * cache_itemsize(c->cache_dtype);
  struct kv_view kv = {(const char *)c->key_cache + head_bytes,
                       (const char *)c->value_cache + head_bytes, c->row_stride, c->cache_dtype,
                       c->k_scale, c->v_scale};
  const int32_t *block_table = c->block_tables + b * c->block_table_stride;
#ifdef LLMC_PA_AMX
  if (num_queries > 1 && c->amx_bf16) {
    attend_tile_amx(q_group, c->q_stride, out_group, (int64_t)c->num_heads * head_dim, &kv,
                    block_table, c->block_size, group, head_dim, num_queries, position,
                    c->sliding_window, c->scale, c->softcap);
    return;
  }
#endif
  if (num_queries > 1) {
    attend_tile(q_group, c->q_stride, out_group, (int64_t)c->num_heads * head_dim, &kv,
                block_table, c->block_size, group, head_dim, num_queries, position,
                c->sliding_window, c->scale, c->softcap);
  } else {
    int first = c->sliding_window > 0 && position - c->sliding_window + 1 > 0
                    ? position - c->sliding_window + 1
                    : 0;
    attend_group(q_group, out_group, &kv, block_table, c->block_size, group, head_dim, first,
                 position, c->scale, c->softcap);
  }
}

/* Returns PA_OK, or a PA_BAD_* code before anything is written. parallel NULL: the items run on
 * this file's thread pool. Strides are in elements. sliding_window <= 0 and softcap <= 0 mean
 * off. The caches hold cache_dtype (PA_CACHE_*) elements; k_scale and v_scale (> 0) are used by
 * the quantized ones only. */
int llmc_paged_attention_on(const struct llmc_pa_parallel *parallel, const float *q,
                            int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                            int64_t v_stride, void *key_cache, void *value_cache,
                            int64_t num_blocks, int block_size, const int32_t *seq_lens,
                            const int32_t *query_start_loc, const int32_t *block_tables,
                            int64_t block_table_stride, int max_blocks,
                            const int64_t *slot_mapping, float *out, int num_tokens,
                            int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                            float scale, int sliding_window, float softcap, int cache_dtype,
                            float k_scale, float v_scale, int fpmath_mode) {
  if (cache_dtype != PA_CACHE_F32 && cache_dtype != PA_CACHE_FP8_E4M3FN &&
      cache_dtype != PA_CACHE_INT8) {
    return PA_BAD_CACHE_DTYPE;
  }
  int status = check_metadata(seq_lens, query_start_loc, block_tables, block_table_stride,
                              max_blocks, slot_mapping, num_tokens, num_seqs, num_blocks,
                              block_size);
  if (status != PA_OK) return status;
  if (cache_dtype == PA_CACHE_FP8_E4M3FN) pthread_once(&fp8_table_once, fill_fp8_table);

  int64_t row_stride = (int64_t)num_kv_heads * head_dim;
  size_t row_bytes = row_stride * cache_itemsize(cache_dtype);
  for (int t = 0; t < num_tokens; ++t) {
    encode_row(k + t * k_stride, (char *)key_cache + slot_mapping[t] * row_bytes, row_stride,
               cache_dtype, k_scale);
    encode_row(v + t * v_stride, (char *)value_cache + slot_mapping[t] * row_bytes, row_stride,
               cache_dtype, v_scale);
  }

  /* Work items: (tile of up to QUERY_ROWS / G consecutive new tokens of one sequence, KV head).
   * Why tiles: each K/V row read from the cache then serves all the tile's tokens (attend_tile);
   * a one-token tile (a decode) runs attend_group. Why KV heads and tiles rather than whole
   * sequences: a single prefill with MQA is one sequence and one KV head, which would leave every
   * core but one idle. Dynamic scheduling, last tiles first: a prefill's later tokens see more
   * context, so the costliest items go out first and the cheap ones even out the end. */
  int group = num_heads / num_kv_heads;
  int tile_tokens = QUERY_ROWS / group > 1 ? QUERY_ROWS / group : 1;
  int32_t tile_start[num_seqs + 1]; /* prefix sums of the sequences' tile counts */
  int64_t work = 0;                 /* multiply-adds of q.k, an upper bound (windows ignored) */
  tile_start[0] = 0;
  for (int b = 0; b < num_seqs; ++b) {
    int num_new = query_start_loc[b + 1] - query_start_loc[b];
    tile_start[b + 1] = tile_start[b] + (num_new + tile_tokens - 1) / tile_tokens;
    work += (int64_t)num_new * seq_lens[b];
  }
  work *= (int64_t)num_heads * head_dim;
  int64_t num_items = (int64_t)tile_start[num_seqs] * num_kv_heads;
  struct step_ctx ctx = {q, q_stride, out, key_cache, value_cache, cache_dtype, k_scale,
                         v_scale, seq_lens, query_start_loc, block_tables, block_table_stride,
                         tile_start, num_seqs, num_heads, num_kv_heads, head_dim, group,
                         tile_tokens, row_stride, block_size, sliding_window, scale, softcap,
                         num_items, 0};
#ifdef LLMC_PA_AMX
  ctx.amx_bf16 = fpmath_mode == PA_FPMATH_BF16 && head_dim % 32 == 0 && head_dim <= AMX_MAX_D &&
                 amx_bf16_available();
#endif
  if (work < PARALLEL_MIN_WORK || num_items < 2) {
    for (int64_t i = 0; i < num_items; ++i) attend_item(&ctx, i);
  } else if (parallel == NULL) {
    parallel_for(attend_item, &ctx, num_items, 1);
  } else {
    parallel->run(parallel->runner, attend_item, &ctx, num_items);
  }
  return PA_OK;
}
