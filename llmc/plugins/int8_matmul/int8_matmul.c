/* Block-wise int8 matrix product with int8 activations (see int8_matmul.h for the definition):
 * the weight's packing, and the activations' quantization (with the GELU of a gated input).
 * The tiles that multiply them are in vnni.c (and portable C), avx2.c and amx.c.
 *
 * Weights are repacked once into panels of 64 output channels, four input channels per 32-bit
 * lane ([k / 4][64][4] int8), the layout vpdpbusd reads: one 64-byte load holds 16 columns times
 * 4 input channels. Activations are quantized per row and block to int8 codes. vpdpbusd wants
 * one operand unsigned: the VNNI tiles make it the weight (code + 128, one XOR per load) and take
 * the 128 * sum of the row's block codes back, which the quantization computes per row and
 * block; a per-column sum instead (unsigned activations) would be a second weight-sized stream
 * to read. A tile of 6 rows x 64 columns keeps 24 int32 accumulators in registers for one
 * block, then scales them into float32 outputs (sa * sw) and starts the next block.
 *
 * Method: the VNNI int8 GEMM of oneDNN / MLAS (a u8 x s8 micro-kernel on packed panels, the
 * zero point through precomputed sums); the per-block activation scales are MatMulNBits'
 * CompInt8.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "../simd_math.h"
#include "int8_matmul_internal.h"

enum { HUGE_PAGE = 2 << 20 };

/* bytes for packed weights, 64-byte aligned; one of a huge page or more starts on a 2 MiB
 * boundary and asks Linux for transparent huge pages over its whole 2 MiB pages (the tail stays
 * in 4 KiB pages, so no memory is added). The tiles stream a weight once per product: with
 * 4 KiB pages a vocabulary projection's one-row product ran at 20-25 GB/s on one core, with
 * huge pages 29-33 GB/s (AMD EPYC Zen 4, benchmarks/bench_int8_tiles.c), as the TLB then covers
 * what the hardware prefetcher streams. Freed with free(). */
static void *alloc_weight_bytes(size_t bytes) {
  void *p = NULL;
  if (bytes < HUGE_PAGE) return posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
  if (posix_memalign(&p, HUGE_PAGE, bytes) != 0) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, bytes / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* advice: ignored where refused */
#endif
  return p;
}

int i8mm_pack(struct i8mm_weights *w, const uint8_t *b, const float *scales, int64_t k,
              int64_t n, int64_t block_size) {
  memset(w, 0, sizeof *w);
  if (k < 1 || n < 1 || block_size < 4 || block_size % 4 != 0 || k % block_size != 0)
    return I8MM_BAD_SHAPE;
  int64_t num_blocks = k / block_size, num_panels = (n + I8MM_PANEL - 1) / I8MM_PANEL;
  int64_t width = num_panels * I8MM_PANEL;
  int8_t *codes = alloc_weight_bytes((size_t)(num_panels * PANEL_BYTES(k)));
  float *packed_scales = alloc_weight_bytes((size_t)(num_blocks * width) * sizeof *packed_scales);
  if (codes == NULL || packed_scales == NULL) {
    free(codes);
    free(packed_scales);
    return I8MM_NO_MEMORY;
  }
  memset(codes, 0, (size_t)(num_panels * PANEL_BYTES(k)));
  memset(packed_scales, 0, (size_t)(num_blocks * width) * sizeof *packed_scales);
  for (int64_t col = 0; col < n; ++col) {
    int64_t p = col / I8MM_PANEL, c = col % I8MM_PANEL;
    int8_t *panel = codes + p * PANEL_BYTES(k);
    const uint8_t *row = b + col * k;
    for (int64_t i = 0; i < k; ++i)
      panel[((i / 4) * I8MM_PANEL + c) * 4 + i % 4] = (int8_t)((int32_t)row[i] - 128);
    for (int64_t g = 0; g < num_blocks; ++g) /* PANEL_BLOCK's index: w is not filled yet */
      packed_scales[(p * num_blocks + g) * I8MM_PANEL + c] = scales[col * num_blocks + g];
  }
  *w = (struct i8mm_weights){k, n, block_size, num_blocks, num_panels, codes, packed_scales,
                             i8mm_prefetch_helps()};
  return I8MM_OK;
}

/* Whether the VNNI tiles' software prefetch of the next panel pays on this CPU: on an Intel
 * Xeon (host C of benchmarks/RESULTS.md) the vocabulary projection at M = 16 ran 1.24x faster
 * with it; on an AMD EPYC Zen 4 (host A) 1.1-1.2x slower at M = 16 and 1.1-1.3x at M = 1
 * (benchmarks/bench_int8_tiles.c, one core), its hardware prefetcher streaming the panels
 * better alone. */
int i8mm_prefetch_helps(void) {
#if defined(__x86_64__) || defined(__i386__)
  return !__builtin_cpu_is("amd");
#else
  return 0;
#endif
}

void i8mm_free(struct i8mm_weights *w) {
  free(w->codes);
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
#elif I8MM_AVX2
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  for (; i + 8 <= len; i += 8)
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + i), magnitude));
  float lanes[8];
  _mm256_storeu_ps(lanes, vmax);
  for (int j = 0; j < 8; ++j) amax = fmaxf(amax, lanes[j]);
#endif
  for (; i < len; ++i) amax = fmaxf(amax, fabsf(x[i]));
  return amax;
}

/* gelu_tanh(x) = x * sigmoid(z), z = 2 sqrt(2 / pi) (x + 0.044715 x^3), with
 * sigmoid(z) = 1 / (1 + e) for z >= 0 and e / (1 + e) below, e = exp(-|z|): exp only ever sees
 * a nonpositive argument (no overflow). exp: llmc_exp_nonpositive (../simd_math.h). */
#define GELU_Z 1.5957691216057308f /* 2 sqrt(2 / pi) */
#define GELU_CUBIC 0.044715f

static inline float gelu_tanh(float x) {
  float z = GELU_Z * (x + GELU_CUBIC * x * x * x);
  float e = llmc_exp_nonpositive(-fabsf(z));
  return x * (z >= 0.f ? 1.f : e) / (1.f + e);
}

#if I8MM_VNNI
static inline __m512 gelu_tanh16(__m512 x) {
  __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  __m512 z = _mm512_mul_ps(_mm512_set1_ps(GELU_Z),
                           _mm512_fmadd_ps(_mm512_set1_ps(GELU_CUBIC), x3, x));
  __m512 e = llmc_exp_nonpositive16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(z)));
  __mmask16 positive = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_GE_OQ);
  __m512 numerator = _mm512_mask_blend_ps(positive, e, _mm512_set1_ps(1.0f));
  return _mm512_div_ps(_mm512_mul_ps(x, numerator), _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}
#elif I8MM_AVX2
static inline __m256 gelu_tanh8(__m256 x) {
  __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  __m256 z = _mm256_mul_ps(_mm256_set1_ps(GELU_Z),
                           _mm256_fmadd_ps(_mm256_set1_ps(GELU_CUBIC), x3, x));
  __m256 e = llmc_exp_nonpositive8(
      _mm256_sub_ps(_mm256_setzero_ps(), _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z)));
  __m256 positive = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_GE_OQ);
  __m256 numerator = _mm256_blendv_ps(e, _mm256_set1_ps(1.0f), positive);
  return _mm256_div_ps(_mm256_mul_ps(x, numerator), _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
}
#endif

void i8mm_gelu_tanh_gate(const float *gate, const float *up, int64_t n, float *out) {
  int64_t i = 0;
#if I8MM_VNNI
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i,
                     _mm512_mul_ps(gelu_tanh16(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
#elif I8MM_AVX2
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_mul_ps(gelu_tanh8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
#endif
  for (; i < n; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
}

void i8mm_gate_tiles(const struct i8mm_weights *w, int64_t rows, int64_t m0, int64_t q,
                     const float *gate, const float *up, float *y) {
  const int64_t half = w->n / 2;
  for (int64_t r = 0; r < rows; ++r)
    i8mm_gelu_tanh_gate(gate + r * I8MM_PANEL, up + r * I8MM_PANEL, I8MM_PANEL,
                        y + (m0 + r) * half + q * I8MM_PANEL);
}

void i8mm_quantize_rows(const struct i8mm_weights *w, const float *a, int input, int64_t m0,
                        int64_t m1, int8_t *qa, float *sa, int32_t *za) {
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
      int8_t *q = qa + m * k + g * bs;
      float scale = block_amax(x, bs) / 127.f;
      float inverse = scale != 0.f ? 1.f / scale : 0.f;
      sa[m * w->num_blocks + g] = scale;
      int64_t i = 0;
      int32_t sum = 0; /* of the block's codes */
#if I8MM_VNNI
      const __m512 vinv = _mm512_set1_ps(inverse);
      __m512i sums = _mm512_setzero_si512();
      for (; i + 16 <= bs; i += 16) {
        __m512i code = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
        sums = _mm512_add_epi32(sums, code);
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(code));
      }
      sum = _mm512_reduce_add_epi32(sums);
#elif I8MM_AVX2
      const __m256 vinv = _mm256_set1_ps(inverse);
      const __m128i low_bytes = _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                              -1, -1);
      for (; i + 8 <= bs; i += 8) {
        __m256i code = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
        __m128i lo = _mm_shuffle_epi8(_mm256_castsi256_si128(code), low_bytes);
        __m128i hi = _mm_shuffle_epi8(_mm256_extracti128_si256(code, 1), low_bytes);
        _mm_storel_epi64((__m128i *)(q + i), _mm_unpacklo_epi32(lo, hi));
      }
      for (int64_t j = 0; za != NULL && j < i; ++j) sum += q[j];
#endif
      for (; i < bs; ++i) {
        q[i] = (int8_t)nearbyintf(x[i] * inverse);
        sum += q[i];
      }
      if (za != NULL) za[m * w->num_blocks + g] = 128 * sum;
    }
  }
}

