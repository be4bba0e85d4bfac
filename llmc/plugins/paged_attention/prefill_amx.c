/* Prefill tiles on Intel AMX-BF16 (llmc_pa_attend_tile_amx): llmc_pa_attend_tile with both
 * products on AMX's bf16 tiles (tdpbf16ps: a 16 x 32 bf16 tile times a 32 x 16 one, pairs of
 * the inner dimension side by side, into 16 x 16 float32), for nodes whose fpmath_mode allows
 * bf16 compute: q, k, the softmax weights and v rounded to bfloat16 (round to nearest even),
 * every sum in float32, the softmax itself in float32 as the float32 tiles'. Why: one tdpbf16ps
 * does 16x the multiply-adds of an AVX-512 FMA, and a 128-token prefill spends most of the
 * float32 path's time in those products. Keys go 32 at a time (two bf16 pairs deep for the
 * second product), gathered across cache blocks into a bf16 copy:
 *   scores: S^T [32 keys][32 rows] = K [keys][D] . Q^T, with Q^T packed once per tile as the
 *     B operand ([D / 2][32 rows][2]), so the keys need no transpose and the scores come out in
 *     the [key][row] layout softmax_update takes;
 *   values: O [32 rows][D] += P [rows][32 keys] . V, P transposed from the softmax's layout, V
 *     packed as [keys / 2][D][2]; O lives in a float32 buffer the tiles load and store.
 * All eight tiles are 16 rows x 64 bytes. Method: Intel's AMX programming reference
 * (tdpbf16ps, tile configuration), as in oneDNN's bf16 attention; the online softmax is
 * FlashAttention's (Dao et al. 2022).
 *
 * Built only where the compiler targets AMX (LLMC_PA_AMX); run only where Linux grants this
 * process the tiles. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "attention_parts.h"

#ifdef LLMC_PA_AMX
#include "../amx_tiles.h"
#include "prefill_softmax.h"

static int amx_bf16_granted;
static pthread_once_t amx_bf16_once = PTHREAD_ONCE_INIT;

static void ask_for_amx_bf16(void) {
  amx_bf16_granted = llmc_amx_request(LLMC_AMX_TILE | LLMC_AMX_BF16);
}

int llmc_pa_amx_bf16_available(void) {
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

/* llmc_pa_attend_tile on AMX tiles (attention_parts.h). */
void llmc_pa_attend_tile_amx(const float *restrict q, int64_t q_stride, float *restrict out,
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
