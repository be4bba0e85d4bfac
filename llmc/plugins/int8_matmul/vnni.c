/* The block-wise int8 product's tiles on AVX-512 VNNI (vpdpbusd), and in portable C where the
 * build targets neither it nor AVX2 (avx2.c's tiles; the three give the same floats bit for
 * bit): a tile of up to I8MM_TILE_ROWS rows x one 64-column panel, its int32 accumulators in
 * registers for one block, then scaled by sa * sw into float32 outputs; and the work items
 * (plain and GELU-gated) that run them. vpdpbusd multiplies unsigned by signed bytes: its
 * unsigned operand is the weight code + 128 (one XOR of each 64-byte load), its signed one the
 * activation code, and the accumulators of a row's block start at -za (128 * the sum of its
 * activation codes), so the flush subtracts nothing and nothing beyond the codes and the scales
 * is read per weight panel. The packing and the activations'
 * quantization are in int8_matmul.c. */
#include <math.h>
#include <string.h>

#include "int8_matmul_internal.h"

/* Where the VNNI tiles prefetch the next panel (panel_prefetch). */
enum { PANEL_PREFETCH_NONE = 0, PANEL_PREFETCH_L1 = 1, PANEL_PREFETCH_L2 = 2 };
/* Bytes of packed codes from which a weight counts as larger than L2 (1-2 MB a core). */
#define PANEL_PREFETCH_MIN_BYTES ((int64_t)8 << 20)

/* ---- Micro-kernel ----------------------------------------------------------------------------- */

#if I8MM_VNNI
/* vpdpbusd in place (acc += u8 u x s8 s per 4-byte lane): GCC's intrinsic copies the
 * accumulator around every call. */
#define DPBUSD(acc, u, s) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s))

static inline __m512i broadcast_quad(const int8_t *p) {
  int32_t quad;
  memcpy(&quad, p, 4);
  return _mm512_set1_epi32(quad);
}

/* One tile row r of the micro-kernel: named accumulators so they stay in registers, started at
 * -za of the row's block (a constant ROWS_HERE reads no row past the tile). */
#define ROW_START(r)                                                                       \
  const __m512i start##r =                                                                 \
      _mm512_set1_epi32(ROWS_HERE > r ? -za[(m0 + r) * nb + g] : 0);                       \
  __m512i acc##r##0 = start##r, acc##r##1 = start##r, acc##r##2 = start##r, acc##r##3 = start##r
#define ROW_STEP(r)                                           \
  if (ROWS_HERE > r) {                                           \
    __m512i av = broadcast_quad(ap + r * k);                  \
    DPBUSD(acc##r##0, b0, av);                            \
    DPBUSD(acc##r##1, b1, av);                            \
    DPBUSD(acc##r##2, b2, av);                            \
    DPBUSD(acc##r##3, b3, av);                            \
  }
#define ROW_FLUSH_ONE(r, c)                                                                  \
  out[r][c] = _mm512_fmadd_ps(                                                               \
      _mm512_mul_ps(_mm512_cvtepi32_ps(acc##r##c), scale##c), row,                           \
      out[r][c])
#define ROW_FLUSH(r)                                         \
  if (ROWS_HERE > r) {                                          \
    __m512 row = _mm512_set1_ps(sa[(m0 + r) * nb + g]);      \
    ROW_FLUSH_ONE(r, 0);                                     \
    ROW_FLUSH_ONE(r, 1);                                     \
    ROW_FLUSH_ONE(r, 2);                                     \
    ROW_FLUSH_ONE(r, 3);                                     \
  }

/* A tile of ROWS rows x one panel: per block, 4 x ROWS int32 accumulators in registers; the
 * float32 outputs wait in out (L1) between blocks. PREFETCH: the next panel as it goes into L1
 * (PANEL_PREFETCH_L1), L2 (PANEL_PREFETCH_L2) or not at all (panel_prefetch chooses). */
#define DEFINE_TILE(ROWS, PREFETCH, NAME)                                                        \
  static void NAME(const struct i8mm_weights *w, const int8_t *qa, const float *sa,              \
                   const int32_t *za, int64_t m0, int64_t p, float *dst, int64_t ld) {          \
    const int64_t k = w->k, bs = w->block_size, nb = w->num_blocks;                              \
    const int8_t *panel = w->codes + p * PANEL_BYTES(k);                                         \
    enum { ROWS_HERE = ROWS };                                                                   \
    const __m512i flip = _mm512_set1_epi8((char)0x80);                                           \
    __m512 out[ROWS][4];                                                                         \
    for (int r = 0; r < ROWS; ++r)                                                               \
      for (int c = 0; c < 4; ++c) out[r][c] = _mm512_setzero_ps();                               \
    for (int64_t g = 0; g < nb; ++g) {                                                           \
      ROW_START(0); ROW_START(1); ROW_START(2); ROW_START(3); ROW_START(4); ROW_START(5);        \
      const int8_t *bp = panel + g * (bs / 4) * (I8MM_PANEL * 4);                                \
      const int8_t *ap = qa + m0 * k + g * bs;                                                   \
      for (int64_t kq = 0; kq < bs / 4; ++kq, bp += I8MM_PANEL * 4, ap += 4) {                   \
        if (PREFETCH == PANEL_PREFETCH_L1) PREFETCH_NEXT_PANEL(bp + PANEL_BYTES(k), _MM_HINT_T0); \
        if (PREFETCH == PANEL_PREFETCH_L2) PREFETCH_NEXT_PANEL(bp + PANEL_BYTES(k), _MM_HINT_T1); \
        __m512i b0 = _mm512_xor_si512(_mm512_load_si512(bp), flip);                              \
        __m512i b1 = _mm512_xor_si512(_mm512_load_si512(bp + 64), flip);                         \
        __m512i b2 = _mm512_xor_si512(_mm512_load_si512(bp + 128), flip);                        \
        __m512i b3 = _mm512_xor_si512(_mm512_load_si512(bp + 192), flip);                        \
        ROW_STEP(0) ROW_STEP(1) ROW_STEP(2) ROW_STEP(3) ROW_STEP(4) ROW_STEP(5)                  \
      }                                                                                          \
      const float *scales = w->scales + PANEL_BLOCK(w, p, g);                                    \
      __m512 scale0 = _mm512_load_ps(scales), scale1 = _mm512_load_ps(scales + 16);              \
      __m512 scale2 = _mm512_load_ps(scales + 32), scale3 = _mm512_load_ps(scales + 48);         \
      ROW_FLUSH(0) ROW_FLUSH(1) ROW_FLUSH(2) ROW_FLUSH(3) ROW_FLUSH(4) ROW_FLUSH(5)              \
    }                                                                                            \
    for (int c = 0; c < 4; ++c) {                                                                \
      int64_t col = p * I8MM_PANEL + c * 16, left = w->n - col;                                  \
      if (left <= 0) break;                                                                      \
      __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);           \
      for (int r = 0; r < ROWS; ++r) _mm512_mask_storeu_ps(dst + r * ld + c * 16, mask,          \
                                                           out[r][c]);                           \
    }                                                                                            \
  }

#define DEFINE_TILES(ROWS)                                           \
  DEFINE_TILE(ROWS, PANEL_PREFETCH_NONE, tile_vnni_##ROWS)           \
  DEFINE_TILE(ROWS, PANEL_PREFETCH_L1, tile_vnni_##ROWS##_l1)        \
  DEFINE_TILE(ROWS, PANEL_PREFETCH_L2, tile_vnni_##ROWS##_l2)
DEFINE_TILES(1)
DEFINE_TILES(2)
DEFINE_TILES(3)
DEFINE_TILES(4)
DEFINE_TILES(5)
DEFINE_TILES(6)
#endif

static void tile_portable(const struct i8mm_weights *w, const int8_t *qa, const float *sa,
                          int64_t m0, int64_t rows, int64_t p, float *dst, int64_t ld) {
  const int64_t k = w->k, bs = w->block_size, nb = w->num_blocks;
  const int8_t *panel = w->codes + p * PANEL_BYTES(k);
  float out[I8MM_TILE_ROWS][I8MM_PANEL] = {{0}};
  for (int64_t g = 0; g < nb; ++g) {
    int32_t acc[I8MM_TILE_ROWS][I8MM_PANEL] = {{0}};
    for (int64_t i = g * bs; i < (g + 1) * bs; ++i) {
      const int8_t *codes = panel + (i / 4) * I8MM_PANEL * 4 + i % 4;
      for (int64_t r = 0; r < rows; ++r) {
        int32_t av = qa[(m0 + r) * k + i];
        for (int c = 0; c < I8MM_PANEL; ++c) acc[r][c] += av * codes[c * 4];
      }
    }
    const float *scales = w->scales + PANEL_BLOCK(w, p, g);
    for (int64_t r = 0; r < rows; ++r) {
      float row_scale = sa[(m0 + r) * nb + g];
      for (int c = 0; c < I8MM_PANEL; ++c)
        out[r][c] = fmaf((float)acc[r][c] * scales[c], row_scale, out[r][c]);
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < I8MM_PANEL && p * I8MM_PANEL + c < w->n; ++c)
      dst[r * ld + c] = out[r][c];
}

/* Rows [m0, m0 + rows) x panel p into dst (their first element), rows ld floats apart;
 * prefetch: a PANEL_PREFETCH_* of the VNNI tiles. */
static void tile_at(const struct i8mm_weights *w, const int8_t *qa, const float *sa,
                    const int32_t *za, int64_t m0, int64_t rows, int64_t p, float *dst,
                    int64_t ld, int prefetch) {
#if I8MM_VNNI
  typedef void (*tile_fn)(const struct i8mm_weights *, const int8_t *, const float *,
                          const int32_t *, int64_t, int64_t, float *, int64_t);
  static const tile_fn tiles[3][I8MM_TILE_ROWS] = { /* one micro-kernel per row count */
      {tile_vnni_1, tile_vnni_2, tile_vnni_3, tile_vnni_4, tile_vnni_5, tile_vnni_6},
      {tile_vnni_1_l1, tile_vnni_2_l1, tile_vnni_3_l1, tile_vnni_4_l1, tile_vnni_5_l1,
       tile_vnni_6_l1},
      {tile_vnni_1_l2, tile_vnni_2_l2, tile_vnni_3_l2, tile_vnni_4_l2, tile_vnni_5_l2,
       tile_vnni_6_l2}};
  if (rows >= 1 && rows <= I8MM_TILE_ROWS) {
    tiles[prefetch][rows - 1](w, qa, sa, za, m0, p, dst, ld);
    return;
  }
#elif I8MM_AVX2
  (void)za; /* the AVX2 tiles multiply signed by signed */
  i8mm_tile_avx2(w, qa, sa, m0, rows, p, dst, ld);
  return;
#endif
  (void)za;
  (void)prefetch;
  tile_portable(w, qa, sa, m0, rows, p, dst, ld);
}

/* Where the tiles of an m-row product prefetch the next panel (PANEL_PREFETCH_*): into L1 in
 * every product where i8mm_weights.prefetch says so (Intel); elsewhere into L2, only where each
 * panel serves two or three tiles (7-18 rows: a decode step of that many sequences) and the
 * weight is larger than L2. Why: on an AMD EPYC Zen 4
 * (32 KB L1, benchmarks/bench_int8_tiles.c, one core) a 40 KB panel prefetched into L1 evicted
 * the one being read (the [640, 262144] vocabulary projection at M = 16: 20.1 ms without, 20.9
 * ms into L1), into L2 it ran at 17.9 ms; a one-tile product streams faster on the hardware
 * prefetcher alone (M = 1: 5.8 ms without, 7.0 ms into L2), and at M = 6, 32 and 128 and on
 * weights inside the caches the prefetch changed nothing or cost up to 3%. */
static int panel_prefetch(const struct i8mm_weights *w, int64_t m) {
  if (w->prefetch) return PANEL_PREFETCH_L1;
  int several_tiles = m > I8MM_TILE_ROWS && m <= 3 * I8MM_TILE_ROWS;
  int beyond_l2 = w->num_panels * PANEL_BYTES(w->k) >= PANEL_PREFETCH_MIN_BYTES;
  return several_tiles && beyond_l2 ? PANEL_PREFETCH_L2 : PANEL_PREFETCH_NONE;
}

int64_t i8mm_num_items(const struct i8mm_weights *w, int64_t m) {
  return (m + I8MM_TILE_ROWS - 1) / I8MM_TILE_ROWS * w->num_panels;
}

void i8mm_item(const struct i8mm_weights *w, const int8_t *qa, const float *sa,
               const int32_t *za, int64_t m, int64_t item, float *y) {
  int64_t num_tiles = (m + I8MM_TILE_ROWS - 1) / I8MM_TILE_ROWS;
  int64_t p = item / num_tiles, tile = item % num_tiles;
  int64_t m0 = tile * I8MM_TILE_ROWS, rows = m - m0 < I8MM_TILE_ROWS ? m - m0 : I8MM_TILE_ROWS;
  tile_at(w, qa, sa, za, m0, rows, p, y + m0 * w->n + p * I8MM_PANEL, w->n,
          panel_prefetch(w, m));
}

int64_t i8mm_gated_num_items(const struct i8mm_weights *w, int64_t m) {
  return (m + I8MM_TILE_ROWS - 1) / I8MM_TILE_ROWS * (w->num_panels / 2);
}

void i8mm_gated_item(const struct i8mm_weights *w, const int8_t *qa, const float *sa,
                     const int32_t *za, int64_t m, int64_t item, float *y) {
  int64_t num_tiles = (m + I8MM_TILE_ROWS - 1) / I8MM_TILE_ROWS;
  int64_t q = item / num_tiles, m0 = item % num_tiles * I8MM_TILE_ROWS;
  int64_t rows = m - m0 < I8MM_TILE_ROWS ? m - m0 : I8MM_TILE_ROWS;
  float gate[I8MM_TILE_ROWS * I8MM_PANEL], up[I8MM_TILE_ROWS * I8MM_PANEL];
  int prefetch = panel_prefetch(w, m);
  tile_at(w, qa, sa, za, m0, rows, q, gate, I8MM_PANEL, prefetch);
  tile_at(w, qa, sa, za, m0, rows, q + w->num_panels / 2, up, I8MM_PANEL, prefetch);
  i8mm_gate_tiles(w, rows, m0, q, gate, up, y);
}
