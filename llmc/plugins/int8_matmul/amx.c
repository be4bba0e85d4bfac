/* The block-wise int8 product's tiles on Intel AMX-INT8 (tdpbssd), for products of 16 rows or
 * more on a host whose OS grants the tile registers: plain and GELU-gated work items of 16-32
 * rows x one 64-column panel. Built only where the compiler targets AMX (I8MM_AMX); elsewhere
 * i8mm_amx_rows answers 0 and the items are never run. */
#include "int8_matmul_internal.h"

#if I8MM_AMX
#include <pthread.h>

#include "../amx_tiles.h"
#endif

/* ---- AMX ------------------------------------------------------------------------------------
 * Sapphire Rapids' tile unit: tdpbssd multiplies a 16 x 64 int8 tile of activations by a
 * 16 x 64 int8 tile of weights in VNNI order (16 rows of 4 input channels x 16 columns) into
 * 16 x 16 int32, 16x the multiply-adds of one vpdpbusd. The packed panel ([k / 4][64][4]) is
 * already that order: a weight tile is 16 of its 256-byte rows, 64 bytes each, read with a
 * 256-byte stride. An item computes 32 rows x 64 columns, block by block: two halves of 32
 * columns, each four accumulator tiles (rows 0-15 / 16-31 x columns 0-15 / 16-31), stored and
 * added, scaled by sa * sw, into float32 outputs, as the VNNI tile does. A product whose rows
 * are not a multiple of 32 ends with 16-row items (two accumulator tiles per half): that is
 * how a 16-sequence decode step takes the path, where its vocabulary projection on the VNNI
 * tiles was bound by arithmetic, not by reading the weight. Weights and activations are both
 * signed codes (tdpbssd: no zero point to take back). Linux hands the tile registers to a process
 * only after arch_prctl(ARCH_REQ_XCOMP_PERM) (without it the first tile instruction faults),
 * which i8mm_amx_rows asks for once.
 * Method: Intel's AMX programming reference (tile configuration, tdpbssd), as oneDNN's and
 * MLAS's AMX int8 GEMMs use it. */
#if I8MM_AMX
static int amx_granted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void ask_for_amx(void) { amx_granted = llmc_amx_request(LLMC_AMX_TILE | LLMC_AMX_INT8); }

/* One block's products of 16 or 32 rows (m0.., `tiles` 16-row tiles) by 32 columns (half 0 or 1
 * of panel p's 64) into the accumulator tiles, stored to acc. */
static void amx_block(const struct i8mm_weights *w, const int8_t *qa, int64_t m0, int64_t p,
                      int half, int64_t g, int tiles, int32_t (*acc)[I8MM_PANEL]) {
  const int64_t k = w->k, bs = w->block_size;
  const int8_t *panel = w->codes + p * PANEL_BYTES(k) + half * 32 * 4;
  const int c = half * 32;
  _tile_zero(0);
  _tile_zero(1);
  if (tiles == 2) {
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kk = g * bs; kk < (g + 1) * bs; kk += 64) {
      _tile_loadd(4, qa + m0 * k + kk, k);
      _tile_loadd(5, qa + (m0 + 16) * k + kk, k);
      _tile_loadd(6, panel + (kk / 4) * (I8MM_PANEL * 4), I8MM_PANEL * 4);
      _tile_loadd(7, panel + (kk / 4) * (I8MM_PANEL * 4) + 64, I8MM_PANEL * 4);
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(2, &acc[16][c], sizeof acc[0]);
    _tile_stored(3, &acc[16][c + 16], sizeof acc[0]);
  } else {
    for (int64_t kk = g * bs; kk < (g + 1) * bs; kk += 64) {
      _tile_loadd(4, qa + m0 * k + kk, k);
      _tile_loadd(6, panel + (kk / 4) * (I8MM_PANEL * 4), I8MM_PANEL * 4);
      _tile_loadd(7, panel + (kk / 4) * (I8MM_PANEL * 4) + 64, I8MM_PANEL * 4);
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
    }
  }
  _tile_stored(0, &acc[0][c], sizeof acc[0]);
  _tile_stored(1, &acc[0][c + 16], sizeof acc[0]);
}

/* `height` (16 or 32) rows x panel p: per block, both halves' tiles (the block's activation
 * rows are then read from L1 the second time), then acc scaled by sa * sw and added into the
 * float32 outputs: in out between blocks, from zero at the first block (no clearing pass) and
 * straight into dst at the last (no copying pass), rows below m and columns below n only. */
static void amx_tile(const struct i8mm_weights *w, const int8_t *qa, const float *sa, int64_t m,
                     int64_t m0, int64_t height, int64_t p, float *dst, int64_t ld) {
  const int64_t nb = w->num_blocks;
  const int halves = p * I8MM_PANEL + 32 < w->n ? 2 : 1;
  const int64_t rows_out = m - m0 < height ? m - m0 : height;
  __mmask16 masks[4];
  for (int c = 0; c < 4; ++c) {
    int64_t left = w->n - (p * I8MM_PANEL + 16 * c);
    masks[c] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
  }
  float out[I8MM_AMX_ROWS][I8MM_PANEL] __attribute__((aligned(64)));
  int32_t acc[I8MM_AMX_ROWS][I8MM_PANEL] __attribute__((aligned(64)));
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t g = 0; g < nb; ++g) {
    for (int half = 0; half < halves; ++half)
      amx_block(w, qa, m0, p, half, g, (int)(height / 16), acc);
    const float *scales = w->scales + PANEL_BLOCK(w, p, g);
    __m512 sw[4];
    for (int c = 0; c < 4; ++c) sw[c] = _mm512_load_ps(scales + 16 * c);
    const int first = g == 0, last = g + 1 == nb;
    for (int64_t r = 0; r < height; ++r) {
      __m512 row = _mm512_set1_ps(sa[(m0 + r) * nb + g]);
      for (int c = 0; c < 2 * halves; ++c) {
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(&acc[r][16 * c])), sw[c]);
        __m512 sum = _mm512_fmadd_ps(v, row, first ? zero : _mm512_load_ps(&out[r][16 * c]));
        if (!last)
          _mm512_store_ps(&out[r][16 * c], sum);
        else if (r < rows_out)
          _mm512_mask_storeu_ps(dst + r * ld + 16 * c, masks[c], sum);
      }
    }
  }
}

/* Item `item` of an AMX product over `rows` rows: its panel, first row and height (32, or 16
 * for the last tile of rows that are not a multiple of 32). */
static void amx_item_at(int64_t rows, int64_t item, int64_t *panel, int64_t *m0,
                        int64_t *height) {
  int64_t num_tiles = (rows + I8MM_AMX_ROWS - 1) / I8MM_AMX_ROWS;
  *panel = item / num_tiles;
  *m0 = item % num_tiles * I8MM_AMX_ROWS;
  *height = rows - *m0 < I8MM_AMX_ROWS ? rows - *m0 : I8MM_AMX_ROWS;
}
#endif

int64_t i8mm_amx_rows(const struct i8mm_weights *w, int64_t m) {
#if I8MM_AMX
  if (m < I8MM_AMX_MIN_ROWS || w->block_size % 64 != 0) return 0;
  pthread_once(&amx_once, ask_for_amx);
  if (!amx_granted) return 0;
  return (m + I8MM_AMX_MIN_ROWS - 1) / I8MM_AMX_MIN_ROWS * I8MM_AMX_MIN_ROWS;
#else
  (void)w;
  (void)m;
  return 0;
#endif
}

int64_t i8mm_amx_num_items(const struct i8mm_weights *w, int64_t rows) {
  return (rows + I8MM_AMX_ROWS - 1) / I8MM_AMX_ROWS * w->num_panels;
}

void i8mm_amx_item(const struct i8mm_weights *w, const int8_t *qa, const float *sa, int64_t m,
                   int64_t rows, int64_t item, float *y) {
#if I8MM_AMX
  int64_t p, m0, height;
  amx_item_at(rows, item, &p, &m0, &height);
  llmc_amx_configure(); /* per thread: ORT's pool threads each hold their own tile state */
  amx_tile(w, qa, sa, m, m0, height, p, y + m0 * w->n + p * I8MM_PANEL, w->n);
#else
  (void)w, (void)qa, (void)sa, (void)m, (void)rows, (void)item, (void)y;
#endif
}

int64_t i8mm_amx_gated_num_items(const struct i8mm_weights *w, int64_t rows) {
  return (rows + I8MM_AMX_ROWS - 1) / I8MM_AMX_ROWS * (w->num_panels / 2);
}

void i8mm_amx_gated_item(const struct i8mm_weights *w, const int8_t *qa, const float *sa,
                         int64_t m, int64_t rows, int64_t item, float *y) {
#if I8MM_AMX
  int64_t q, m0, height;
  amx_item_at(rows, item, &q, &m0, &height);
  float gate[I8MM_AMX_ROWS * I8MM_PANEL] __attribute__((aligned(64)));
  float up[I8MM_AMX_ROWS * I8MM_PANEL] __attribute__((aligned(64)));
  llmc_amx_configure();
  amx_tile(w, qa, sa, m, m0, height, q, gate, I8MM_PANEL);
  amx_tile(w, qa, sa, m, m0, height, q + w->num_panels / 2, up, I8MM_PANEL);
  i8mm_gate_tiles(w, m - m0 < height ? m - m0 : height, m0, q, gate, up, y);
#else
  (void)w, (void)qa, (void)sa, (void)m, (void)rows, (void)item, (void)y;
#endif
}

