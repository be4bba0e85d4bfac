/* Block-wise int8 matrix product with int8 activations (see int8_matmul.h for the definition).
 *
 * Weights are repacked once into panels of 64 output channels, four input channels per 32-bit
 * lane ([k / 4][64][4] int8), the layout vpdpbusd reads: one 64-byte load holds 16 columns times
 * 4 input channels. Activations are quantized per row and block to uint8 (code + 128, what
 * vpdpbusd's unsigned operand wants); the +128 is taken back with each block's precomputed
 * column sums. A tile of 6 rows x 64 columns keeps 24 int32 accumulators in registers for one
 * block, then scales them into float32 outputs (sa * sw) and starts the next block.
 *
 * Method: the VNNI int8 GEMM of oneDNN / MLAS (a u8 x s8 micro-kernel on packed panels, zero
 * point through column sums); the per-block activation scales are MatMulNBits' CompInt8.
 */
#include "int8_matmul.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define I8MM_VNNI 1
#else
#define I8MM_VNNI 0
#endif

/* AMX where the compiler targets it (-march=native on a host that has it); whether the OS lets
 * this process use the tiles is asked at run time (i8mm_amx_rows). */
#if I8MM_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#include <pthread.h>

#include "../amx_tiles.h"
#define I8MM_AMX 1
#else
#define I8MM_AMX 0
#endif

#define PANEL_BYTES(k) ((k) / 4 * I8MM_PANEL * 4)

int i8mm_pack(struct i8mm_weights *w, const uint8_t *b, const float *scales, int64_t k,
              int64_t n, int64_t block_size) {
  memset(w, 0, sizeof *w);
  if (k < 1 || n < 1 || block_size < 4 || block_size % 4 != 0 || k % block_size != 0)
    return I8MM_BAD_SHAPE;
  int64_t num_blocks = k / block_size, num_panels = (n + I8MM_PANEL - 1) / I8MM_PANEL;
  int64_t width = num_panels * I8MM_PANEL;
  int8_t *codes = aligned_alloc(64, (size_t)(num_panels * PANEL_BYTES(k)));
  int32_t *sums = aligned_alloc(64, (size_t)(num_blocks * width) * sizeof *sums);
  float *packed_scales = aligned_alloc(64, (size_t)(num_blocks * width) * sizeof *packed_scales);
  if (codes == NULL || sums == NULL || packed_scales == NULL) {
    free(codes);
    free(sums);
    free(packed_scales);
    return I8MM_NO_MEMORY;
  }
  memset(codes, 0, (size_t)(num_panels * PANEL_BYTES(k)));
  memset(sums, 0, (size_t)(num_blocks * width) * sizeof *sums);
  memset(packed_scales, 0, (size_t)(num_blocks * width) * sizeof *packed_scales);
  for (int64_t col = 0; col < n; ++col) {
    int64_t p = col / I8MM_PANEL, c = col % I8MM_PANEL;
    int8_t *panel = codes + p * PANEL_BYTES(k);
    const uint8_t *row = b + col * k;
    for (int64_t g = 0; g < num_blocks; ++g) {
      int32_t sum = 0;
      for (int64_t i = g * block_size; i < (g + 1) * block_size; ++i) {
        int8_t code = (int8_t)((int32_t)row[i] - 128);
        panel[((i / 4) * I8MM_PANEL + c) * 4 + i % 4] = code;
        sum += code;
      }
      sums[g * width + col] = 128 * sum;
      packed_scales[g * width + col] = scales[col * num_blocks + g];
    }
  }
  *w = (struct i8mm_weights){k, n, block_size, num_blocks, num_panels, codes, sums,
                             packed_scales};
  return I8MM_OK;
}

void i8mm_free(struct i8mm_weights *w) {
  free(w->codes);
  free(w->sums);
  free(w->scales);
  memset(w, 0, sizeof *w);
}

/* ---- Activations ---------------------------------------------------------------------------- */

static float block_amax(const float *x, int64_t len) {
  float amax = 0.f;
  int64_t i = 0;
#if I8MM_VNNI
  __m512 vmax = _mm512_setzero_ps();
  for (; i + 16 <= len; i += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  amax = _mm512_reduce_max_ps(vmax);
#endif
  for (; i < len; ++i) amax = fmaxf(amax, fabsf(x[i]));
  return amax;
}

/* gelu_tanh(x) = x * sigmoid(z), z = 2 sqrt(2 / pi) (x + 0.044715 x^3), with
 * sigmoid(z) = 1 / (1 + e) for z >= 0 and e / (1 + e) below, e = exp(-|z|): exp only ever sees
 * a nonpositive argument (no overflow). exp: Cephes' expf reduction and polynomial. */
#define GELU_Z 1.5957691216057308f /* 2 sqrt(2 / pi) */
#define GELU_CUBIC 0.044715f

static inline float exp_nonpositive(float x) {
  x = x > -87.0f ? x : -87.0f;
  float n = nearbyintf(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return ldexpf(p, (int)n);
}

static inline float gelu_tanh(float x) {
  float z = GELU_Z * (x + GELU_CUBIC * x * x * x);
  float e = exp_nonpositive(-fabsf(z));
  return x * (z >= 0.f ? 1.f : e) / (1.f + e);
}

#if I8MM_VNNI
static inline __m512 exp_nonpositive16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

static inline __m512 gelu_tanh16(__m512 x) {
  __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  __m512 z = _mm512_mul_ps(_mm512_set1_ps(GELU_Z),
                           _mm512_fmadd_ps(_mm512_set1_ps(GELU_CUBIC), x3, x));
  __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(z)));
  __mmask16 positive = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_GE_OQ);
  __m512 numerator = _mm512_mask_blend_ps(positive, e, _mm512_set1_ps(1.0f));
  return _mm512_div_ps(_mm512_mul_ps(x, numerator), _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}
#endif

void i8mm_gelu_tanh_gate(const float *gate, const float *up, int64_t n, float *out) {
  int64_t i = 0;
#if I8MM_VNNI
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i,
                     _mm512_mul_ps(gelu_tanh16(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
#endif
  for (; i < n; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
}

/* ---- GELU-gated output ------------------------------------------------------------------------
 * A gated MLP's fused [gate | up] projection whose consumer wants gelu_tanh(gate) * up: each
 * gated item (i8mm_gated_item, i8mm_amx_gated_item, below) computes panel q of the gate half
 * and its partner q + num_panels / 2 of the up half for the same rows into two local tiles, and
 * writes only their product: [m][n / 2] floats leave the kernel instead of [m][n] (half the
 * output traffic; the consumer also reads half), and the GELU runs on data still in L1. Needs
 * n % 128 == 0 (whole panels in both halves). */

/* out [rows][n / 2] at (m0, q * 64) = gelu_tanh(gate) * up of two [rows][64] tiles. */
static void gate_tiles(const struct i8mm_weights *w, int64_t rows, int64_t m0, int64_t q,
                       const float *gate, const float *up, float *y) {
  const int64_t half = w->n / 2;
  for (int64_t r = 0; r < rows; ++r)
    i8mm_gelu_tanh_gate(gate + r * I8MM_PANEL, up + r * I8MM_PANEL, I8MM_PANEL,
                        y + (m0 + r) * half + q * I8MM_PANEL);
}

/* Rows [m0, m1) quantized per block, each code stored plus offset (128: vpdpbusd's unsigned
 * operand; 0: AMX's signed tdpbssd). */
static void quantize_rows(const struct i8mm_weights *w, const float *a, int input, int64_t m0,
                          int64_t m1, uint8_t *qa, float *sa, int32_t offset_value) {
  const int64_t k = w->k, bs = w->block_size;
  const int64_t row_stride = input == I8MM_INPUT_GELU_TANH_GATE ? 2 * k : k;
  float gated[input == I8MM_INPUT_GELU_TANH_GATE ? bs : 1]; /* one block of the gated input */
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t g = 0; g < w->num_blocks; ++g) {
      const float *x = a + m * row_stride + g * bs;
      if (input == I8MM_INPUT_GELU_TANH_GATE) {
        i8mm_gelu_tanh_gate(x, x + k, bs, gated);
        x = gated;
      }
      uint8_t *q = qa + m * k + g * bs;
      float scale = block_amax(x, bs) / 127.f;
      float inverse = scale != 0.f ? 1.f / scale : 0.f;
      sa[m * w->num_blocks + g] = scale;
      int64_t i = 0;
#if I8MM_VNNI
      const __m512 vinv = _mm512_set1_ps(inverse);
      const __m512i offset = _mm512_set1_epi32(offset_value);
      for (; i + 16 <= bs; i += 16) {
        __m512i code = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
        _mm_storeu_si128((__m128i *)(q + i),
                         _mm512_cvtepi32_epi8(_mm512_add_epi32(code, offset)));
      }
#endif
      for (; i < bs; ++i) q[i] = (uint8_t)((int32_t)nearbyintf(x[i] * inverse) + offset_value);
    }
  }
}

void i8mm_quantize_rows(const struct i8mm_weights *w, const float *a, int input, int64_t m0,
                        int64_t m1, uint8_t *qa, float *sa) {
  quantize_rows(w, a, input, m0, m1, qa, sa, 128);
}

void i8mm_quantize_rows_signed(const struct i8mm_weights *w, const float *a, int input,
                               int64_t m0, int64_t m1, int8_t *qa, float *sa) {
  quantize_rows(w, a, input, m0, m1, (uint8_t *)qa, sa, 0);
}

/* ---- Micro-kernel ----------------------------------------------------------------------------- */

#if I8MM_VNNI
/* vpdpbusd in place: GCC's intrinsic copies the accumulator around every call. */
#define DPBUSD(acc, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))

static inline __m512i broadcast_quad(const uint8_t *p) {
  int32_t quad;
  memcpy(&quad, p, 4);
  return _mm512_set1_epi32(quad);
}

/* One tile row r of the micro-kernel: named accumulators so they stay in registers. */
#define ROW_ZERO(r) __m512i acc##r##0 = zero, acc##r##1 = zero, acc##r##2 = zero, acc##r##3 = zero
#define ROW_STEP(r)                                           \
  if (ROWS_HERE > r) {                                           \
    __m512i av = broadcast_quad(ap + r * k);                  \
    DPBUSD(acc##r##0, av, b0);                            \
    DPBUSD(acc##r##1, av, b1);                            \
    DPBUSD(acc##r##2, av, b2);                            \
    DPBUSD(acc##r##3, av, b3);                            \
  }
#define ROW_FLUSH_ONE(r, c)                                                                  \
  out[r][c] = _mm512_fmadd_ps(                                                               \
      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc##r##c, sum##c)), scale##c), row, \
      out[r][c])
#define ROW_FLUSH(r)                                         \
  if (ROWS_HERE > r) {                                          \
    __m512 row = _mm512_set1_ps(sa[(m0 + r) * nb + g]);      \
    ROW_FLUSH_ONE(r, 0);                                     \
    ROW_FLUSH_ONE(r, 1);                                     \
    ROW_FLUSH_ONE(r, 2);                                     \
    ROW_FLUSH_ONE(r, 3);                                     \
  }

/* The same 256 bytes of the next panel, into L1: a thread runs panels in memory order, and on a
 * weight larger than L2 (a vocabulary projection) the first tile of each panel otherwise waits
 * on memory (measured: 1.24x on a [640, 262144] projection at M = 16, nothing lost at M = 128).
 * A prefetch past the last panel is dropped, never a fault. */
#define PREFETCH_NEXT_PANEL(p)                                  \
  do {                                                          \
    _mm_prefetch((const char *)(p), _MM_HINT_T0);               \
    _mm_prefetch((const char *)(p) + 64, _MM_HINT_T0);          \
    _mm_prefetch((const char *)(p) + 128, _MM_HINT_T0);         \
    _mm_prefetch((const char *)(p) + 192, _MM_HINT_T0);         \
  } while (0)

/* A tile of ROWS rows x one panel: per block, 4 x ROWS int32 accumulators in registers; the
 * float32 outputs wait in out (L1) between blocks. */
#define DEFINE_TILE(ROWS)                                                                        \
  static void tile_vnni_##ROWS(const struct i8mm_weights *w, const uint8_t *qa, const float *sa, \
                               int64_t m0, int64_t p, float *dst, int64_t ld) {                 \
    const int64_t k = w->k, bs = w->block_size, nb = w->num_blocks;                              \
    const int64_t width = w->num_panels * I8MM_PANEL;                                            \
    const int8_t *panel = w->codes + p * PANEL_BYTES(k);                                         \
    enum { ROWS_HERE = ROWS };                                                                   \
    const __m512i zero = _mm512_setzero_si512();                                                 \
    __m512 out[ROWS][4];                                                                         \
    for (int r = 0; r < ROWS; ++r)                                                               \
      for (int c = 0; c < 4; ++c) out[r][c] = _mm512_setzero_ps();                               \
    for (int64_t g = 0; g < nb; ++g) {                                                           \
      ROW_ZERO(0); ROW_ZERO(1); ROW_ZERO(2); ROW_ZERO(3); ROW_ZERO(4); ROW_ZERO(5);              \
      const int8_t *bp = panel + g * (bs / 4) * (I8MM_PANEL * 4);                                \
      const uint8_t *ap = qa + m0 * k + g * bs;                                                  \
      for (int64_t kq = 0; kq < bs / 4; ++kq, bp += I8MM_PANEL * 4, ap += 4) {                   \
        PREFETCH_NEXT_PANEL(bp + PANEL_BYTES(k));                                                \
        __m512i b0 = _mm512_load_si512(bp), b1 = _mm512_load_si512(bp + 64);                     \
        __m512i b2 = _mm512_load_si512(bp + 128), b3 = _mm512_load_si512(bp + 192);              \
        ROW_STEP(0) ROW_STEP(1) ROW_STEP(2) ROW_STEP(3) ROW_STEP(4) ROW_STEP(5)                  \
      }                                                                                          \
      const int32_t *sums = w->sums + g * width + p * I8MM_PANEL;                                \
      const float *scales = w->scales + g * width + p * I8MM_PANEL;                              \
      __m512i sum0 = _mm512_load_si512(sums), sum1 = _mm512_load_si512(sums + 16);               \
      __m512i sum2 = _mm512_load_si512(sums + 32), sum3 = _mm512_load_si512(sums + 48);          \
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

DEFINE_TILE(1)
DEFINE_TILE(2)
DEFINE_TILE(3)
DEFINE_TILE(4)
DEFINE_TILE(5)
DEFINE_TILE(6)
#endif

static void tile_portable(const struct i8mm_weights *w, const uint8_t *qa, const float *sa,
                          int64_t m0, int64_t rows, int64_t p, float *dst, int64_t ld) {
  const int64_t k = w->k, bs = w->block_size, nb = w->num_blocks;
  const int64_t width = w->num_panels * I8MM_PANEL;
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
    const int32_t *sums = w->sums + g * width + p * I8MM_PANEL;
    const float *scales = w->scales + g * width + p * I8MM_PANEL;
    for (int64_t r = 0; r < rows; ++r) {
      float row_scale = sa[(m0 + r) * nb + g];
      for (int c = 0; c < I8MM_PANEL; ++c)
        out[r][c] += (float)(acc[r][c] - sums[c]) * scales[c] * row_scale;
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < I8MM_PANEL && p * I8MM_PANEL + c < w->n; ++c)
      dst[r * ld + c] = out[r][c];
}

/* Rows [m0, m0 + rows) x panel p into dst (their first element), rows ld floats apart. */
static void tile_at(const struct i8mm_weights *w, const uint8_t *qa, const float *sa, int64_t m0,
                    int64_t rows, int64_t p, float *dst, int64_t ld) {
#if I8MM_VNNI
  switch (rows) { /* one micro-kernel per row count */
    case 6: tile_vnni_6(w, qa, sa, m0, p, dst, ld); return;
    case 5: tile_vnni_5(w, qa, sa, m0, p, dst, ld); return;
    case 4: tile_vnni_4(w, qa, sa, m0, p, dst, ld); return;
    case 3: tile_vnni_3(w, qa, sa, m0, p, dst, ld); return;
    case 2: tile_vnni_2(w, qa, sa, m0, p, dst, ld); return;
    case 1: tile_vnni_1(w, qa, sa, m0, p, dst, ld); return;
    default: break;
  }
#endif
  tile_portable(w, qa, sa, m0, rows, p, dst, ld);
}

void i8mm_tile(const struct i8mm_weights *w, const uint8_t *qa, const float *sa, int64_t m0,
               int64_t rows, int64_t p, float *y) {
  tile_at(w, qa, sa, m0, rows, p, y + m0 * w->n + p * I8MM_PANEL, w->n);
}

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
 * tiles was bound by arithmetic, not by reading the weight. Activations are
 * signed codes (no zero point, so no column sums). Linux hands the tile registers to a process
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
  const int64_t nb = w->num_blocks, width = w->num_panels * I8MM_PANEL;
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
    const float *scales = w->scales + g * width + p * I8MM_PANEL;
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
  gate_tiles(w, m - m0 < height ? m - m0 : height, m0, q, gate, up, y);
#else
  (void)w, (void)qa, (void)sa, (void)m, (void)rows, (void)item, (void)y;
#endif
}

int64_t i8mm_num_items(const struct i8mm_weights *w, int64_t m) {
  return (m + I8MM_TILE_ROWS - 1) / I8MM_TILE_ROWS * w->num_panels;
}

void i8mm_item(const struct i8mm_weights *w, const uint8_t *qa, const float *sa, int64_t m,
               int64_t item, float *y) {
  int64_t num_tiles = (m + I8MM_TILE_ROWS - 1) / I8MM_TILE_ROWS;
  int64_t p = item / num_tiles, tile = item % num_tiles;
  int64_t m0 = tile * I8MM_TILE_ROWS, rows = m - m0 < I8MM_TILE_ROWS ? m - m0 : I8MM_TILE_ROWS;
  i8mm_tile(w, qa, sa, m0, rows, p, y);
}

int64_t i8mm_gated_num_items(const struct i8mm_weights *w, int64_t m) {
  return (m + I8MM_TILE_ROWS - 1) / I8MM_TILE_ROWS * (w->num_panels / 2);
}

void i8mm_gated_item(const struct i8mm_weights *w, const uint8_t *qa, const float *sa, int64_t m,
                     int64_t item, float *y) {
  int64_t num_tiles = (m + I8MM_TILE_ROWS - 1) / I8MM_TILE_ROWS;
  int64_t q = item / num_tiles, m0 = item % num_tiles * I8MM_TILE_ROWS;
  int64_t rows = m - m0 < I8MM_TILE_ROWS ? m - m0 : I8MM_TILE_ROWS;
  float gate[I8MM_TILE_ROWS * I8MM_PANEL], up[I8MM_TILE_ROWS * I8MM_PANEL];
  tile_at(w, qa, sa, m0, rows, q, gate, I8MM_PANEL);
  tile_at(w, qa, sa, m0, rows, q + w->num_panels / 2, up, I8MM_PANEL);
  gate_tiles(w, rows, m0, q, gate, up, y);
}
