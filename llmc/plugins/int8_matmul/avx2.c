/* The block-wise int8 product's tiles on AVX2 (hosts without AVX-512 VNNI): the same tile of up
 * to I8MM_TILE_ROWS rows x one 64-column panel as vnni.c's, the same packed weight and quantized
 * rows, the same int32 block sums and the same float32 scaling, so the outputs equal the VNNI
 * tiles' bit for bit.
 *
 * AVX2 has no u8 x s8 dot product into int32; vpmaddubsw multiplies u8 x s8 byte pairs into
 * saturating int16 and vpmaddwd adds int16 pairs into int32, which together sum 4 products per
 * 32-bit lane as vpdpbusd does. The unsigned operand is |w| and the signed one a * sign(w)
 * (vpabsb, vpsignb): with |a| <= 127 and |w| <= 128 a pair is at most 2 * 127 * 128 = 32,512,
 * so vpmaddubsw never saturates and the int32 sums are exact.
 *
 * A tile runs in column quarters of 16 (two 8-lane vectors) times groups of up to 3 rows: 6
 * int32 accumulators, 2 |w| vectors and the broadcast row stay in registers; the float32
 * outputs wait in L1 between blocks. Method: llama.cpp's AVX2 q8_0 dot product (the sign trick)
 * on the packed panels of oneDNN's VNNI GEMM. */
#include <string.h>

#include "int8_matmul_internal.h"

#if I8MM_AVX2

/* acc += x in place: GCC otherwise computes each sum into a new register and copies it back
 * (6 moves per 24 products; measured 1.23x slower). */
#define ADD_TO(acc, x)                                                  \
  do {                                                                  \
    __m256i x_ = (x);                                                   \
    __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(x_));                 \
  } while (0)

#define QUARTER 16 /* columns per pass: two vectors of 8 */
#define GROUP_ROWS 3

static inline __m256i broadcast_quad(const int8_t *p) {
  int32_t quad;
  memcpy(&quad, p, 4);
  return _mm256_set1_epi32(quad);
}

/* The 4-product sums of a (signed codes, one quad broadcast) and w, per 32-bit lane. */
static inline __m256i dot4(__m256i a, __m256i w, __m256i w_abs, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(a, w)), ones);
}

#define GROUP_ZERO(r) __m256i acc##r##0 = zero, acc##r##1 = zero
#define GROUP_STEP(r)                                                   \
  if (GROUP_HERE > r) {                                                 \
    __m256i av = broadcast_quad(ap + r * k);                            \
    ADD_TO(acc##r##0, dot4(av, w0, abs0, ones));                        \
    ADD_TO(acc##r##1, dot4(av, w1, abs1, ones));                        \
  }
#define GROUP_FLUSH_ONE(r, c)                                                                  \
  out[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc##r##c), scale##c), row, \
                              out[r][c])
#define GROUP_FLUSH(r)                                    \
  if (GROUP_HERE > r) {                                   \
    __m256 row = _mm256_set1_ps(sa[(m0 + r) * nb + g]);   \
    GROUP_FLUSH_ONE(r, 0);                                \
    GROUP_FLUSH_ONE(r, 1);                                \
  }

/* Rows [m0, m0 + ROWS) x columns [q * 16, q * 16 + 16) of panel p into out (float32, [ROWS][2]
 * vectors). */
#define DEFINE_GROUP(ROWS)                                                                     \
  static void group_##ROWS(const struct i8mm_weights *w, const int8_t *qa, const float *sa,    \
                           int64_t m0, int64_t p, int64_t q, __m256 out[GROUP_ROWS][2]) {      \
    const int64_t k = w->k, bs = w->block_size, nb = w->num_blocks;                            \
    const int8_t *panel = w->codes + p * PANEL_BYTES(k) + q * QUARTER * 4;                     \
    enum { GROUP_HERE = ROWS };                                                                \
    const __m256i zero = _mm256_setzero_si256(), ones = _mm256_set1_epi16(1);                  \
    for (int64_t g = 0; g < nb; ++g) {                                                         \
      GROUP_ZERO(0); GROUP_ZERO(1); GROUP_ZERO(2);                                             \
      const int8_t *bp = panel + g * (bs / 4) * (I8MM_PANEL * 4);                              \
      const int8_t *ap = qa + m0 * k + g * bs;                                                 \
      for (int64_t kq = 0; kq < bs / 4; ++kq, bp += I8MM_PANEL * 4, ap += 4) {                 \
        _mm_prefetch((const char *)(bp + PANEL_BYTES(k)), _MM_HINT_T0);                        \
        __m256i w0 = _mm256_load_si256((const __m256i *)bp);                                   \
        __m256i w1 = _mm256_load_si256((const __m256i *)(bp + 32));                            \
        __m256i abs0 = _mm256_abs_epi8(w0), abs1 = _mm256_abs_epi8(w1);                        \
        GROUP_STEP(0) GROUP_STEP(1) GROUP_STEP(2)                                              \
      }                                                                                        \
      const float *scales = w->scales + PANEL_BLOCK(w, p, g) + q * QUARTER;              \
      __m256 scale0 = _mm256_load_ps(scales), scale1 = _mm256_load_ps(scales + 8);             \
      GROUP_FLUSH(0) GROUP_FLUSH(1) GROUP_FLUSH(2)                                             \
    }                                                                                          \
  }

DEFINE_GROUP(1)
DEFINE_GROUP(2)
DEFINE_GROUP(3)

static void group(const struct i8mm_weights *w, const int8_t *qa, const float *sa, int64_t m0,
                  int64_t rows, int64_t p, int64_t q, __m256 out[GROUP_ROWS][2]) {
  switch (rows) {
    case 3: group_3(w, qa, sa, m0, p, q, out); return;
    case 2: group_2(w, qa, sa, m0, p, q, out); return;
    default: group_1(w, qa, sa, m0, p, q, out); return;
  }
}

/* One row x the whole panel (a decode step's product): eight accumulators, the panel read in
 * memory order (quarters would stride it 256 bytes apart; measured: a one-row product of a
 * [640, 262144] weight 1.9x slower, one thread). */
static void one_row(const struct i8mm_weights *w, const int8_t *qa, const float *sa, int64_t m0,
                    int64_t p, __m256 out[8]) {
  const int64_t k = w->k, bs = w->block_size, nb = w->num_blocks;
  const int8_t *panel = w->codes + p * PANEL_BYTES(k);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < nb; ++g) {
    __m256i acc[8];
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_si256();
    const int8_t *bp = panel + g * (bs / 4) * (I8MM_PANEL * 4);
    const int8_t *ap = qa + m0 * k + g * bs;
    for (int64_t kq = 0; kq < bs / 4; ++kq, bp += I8MM_PANEL * 4, ap += 4) {
      PREFETCH_NEXT_PANEL(bp + PANEL_BYTES(k), _MM_HINT_T0);
      __m256i av = broadcast_quad(ap);
      for (int c = 0; c < 8; ++c) {
        __m256i wv = _mm256_load_si256((const __m256i *)(bp + 32 * c));
        ADD_TO(acc[c], dot4(av, wv, _mm256_abs_epi8(wv), ones));
      }
    }
    const float *scales = w->scales + PANEL_BLOCK(w, p, g);
    __m256 row = _mm256_set1_ps(sa[m0 * nb + g]);
    for (int c = 0; c < 8; ++c)
      out[c] = _mm256_fmadd_ps(
          _mm256_mul_ps(_mm256_cvtepi32_ps(acc[c]), _mm256_load_ps(scales + 8 * c)), row, out[c]);
  }
}

/* Columns past n are not stored: a full vector where 8 remain, else lane by lane. */
static void store_row(const __m256 v[2], float *dst, int64_t left) {
  for (int c = 0; c < 2 && left > 0; ++c, left -= 8, dst += 8) {
    if (left >= 8) {
      _mm256_storeu_ps(dst, v[c]);
    } else {
      float lanes[8];
      _mm256_storeu_ps(lanes, v[c]);
      memcpy(dst, lanes, (size_t)left * sizeof *dst);
    }
  }
}

void i8mm_tile_avx2(const struct i8mm_weights *w, const int8_t *qa, const float *sa, int64_t m0,
                    int64_t rows, int64_t p, float *dst, int64_t ld) {
  if (rows == 1) {
    __m256 out[8];
    for (int c = 0; c < 8; ++c) out[c] = _mm256_setzero_ps();
    one_row(w, qa, sa, m0, p, out);
    for (int q = 0; q < 4; ++q) {
      int64_t left = w->n - (p * I8MM_PANEL + q * QUARTER);
      if (left > 0) store_row(out + 2 * q, dst + q * QUARTER, left);
    }
    return;
  }
  for (int64_t q = 0; q < I8MM_PANEL / QUARTER; ++q) {
    int64_t left = w->n - (p * I8MM_PANEL + q * QUARTER);
    if (left <= 0) break;
    for (int64_t r0 = 0; r0 < rows; r0 += GROUP_ROWS) {
      int64_t here = rows - r0 < GROUP_ROWS ? rows - r0 : GROUP_ROWS;
      __m256 out[GROUP_ROWS][2];
      for (int r = 0; r < GROUP_ROWS; ++r) out[r][0] = out[r][1] = _mm256_setzero_ps();
      group(w, qa, sa, m0 + r0, here, p, q, out);
      for (int64_t r = 0; r < here; ++r) store_row(out[r], dst + (r0 + r) * ld + q * QUARTER, left);
    }
  }
}

#endif
