/* exp(x) for x <= 0, vectorizable (libm's expf is a scalar call), shared by llmc's CPU kernels:
 * the softmax of paged_attention/ and the GELU of int8_matmul/. x = n ln2 + r with Cody-Waite
 * range reduction, exp(r) by the Cephes expf polynomial (relative error < 1e-7, measured on
 * [-80, 0]), times 2^n. Below -87 the result is ~2^-126 instead of 0, which neither a softmax
 * sum nor a GELU can tell apart.
 *
 * Two forms of the reduction, each with its SIMD twin that gives the same bits lane by lane:
 *   llmc_exp_nonpositive / llmc_exp_nonpositive16 (AVX-512) / llmc_exp_nonpositive8 (AVX2): n
 *     rounded to nearest even, 2^n by ldexpf / vscalefps / the exponent bits (exact: n >= -126
 *     after the clamp) (int8_matmul's GELU);
 *   llmc_exp_nonpositive_trunc / llmc_exp_nonpositive_trunc8 (AVX2): n = (int)(x log2(e) - 0.5),
 *     2^n built in the exponent bits (paged attention's softmax).
 * Why two: they differ where x log2(e) is a half-integer, and each kernel's outputs are kept
 * bit for bit. */
#ifndef LLMC_SIMD_MATH_H
#define LLMC_SIMD_MATH_H

#include <math.h>
#include <stdint.h>

#if (defined(__AVX2__) && defined(__FMA__)) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define LLMC_EXP_MIN (-87.0f)
#define LLMC_EXP_LOG2E 1.44269504088896341f
#define LLMC_EXP_LN2_HI 0.693359375f /* ln 2 = LN2_HI - LN2_LO, LN2_HI exact in few bits */
#define LLMC_EXP_LN2_LO 2.12194440e-4f
#define LLMC_EXP_P0 1.9875691500e-4f
#define LLMC_EXP_P1 1.3981999507e-3f
#define LLMC_EXP_P2 8.3334519073e-3f
#define LLMC_EXP_P3 4.1665795894e-2f
#define LLMC_EXP_P4 1.6666665459e-1f
#define LLMC_EXP_P5 5.0000001201e-1f

/* exp(r) for |r| <= ln2 / 2: the Cephes polynomial. */
static inline float llmc_exp_poly(float r) {
  float p = LLMC_EXP_P0;
  p = p * r + LLMC_EXP_P1;
  p = p * r + LLMC_EXP_P2;
  p = p * r + LLMC_EXP_P3;
  p = p * r + LLMC_EXP_P4;
  p = p * r + LLMC_EXP_P5;
  return p * r * r + r + 1.0f;
}

/* exp(x), x <= 0: n = round_half_even(x log2(e)), 2^n by ldexpf. */
static inline float llmc_exp_nonpositive(float x) {
  x = x > LLMC_EXP_MIN ? x : LLMC_EXP_MIN;
  float n = nearbyintf(x * LLMC_EXP_LOG2E);
  float r = x - n * LLMC_EXP_LN2_HI + n * LLMC_EXP_LN2_LO;
  return ldexpf(llmc_exp_poly(r), (int)n);
}

/* exp(x), x <= 0: n = (int)(x log2(e) - 0.5) (ties away from zero), 2^n in the exponent bits. */
static inline float llmc_exp_nonpositive_trunc(float x) {
  x = x > LLMC_EXP_MIN ? x : LLMC_EXP_MIN;
  float n = (float)(int)(x * LLMC_EXP_LOG2E - 0.5f);
  float r = x - n * LLMC_EXP_LN2_HI + n * LLMC_EXP_LN2_LO;
  union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
  return llmc_exp_poly(r) * two_n.f;
}

#if defined(__AVX2__) && defined(__FMA__)
/* llmc_exp_poly on 8 lanes. */
static inline __m256 llmc_exp_poly8(__m256 r) {
  __m256 p = _mm256_set1_ps(LLMC_EXP_P0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LLMC_EXP_P1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LLMC_EXP_P2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LLMC_EXP_P3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LLMC_EXP_P4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LLMC_EXP_P5));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  return p;
}

/* llmc_exp_nonpositive_trunc on 8 lanes: the same reduction, polynomial and clamp. */
static inline __m256 llmc_exp_nonpositive_trunc8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(LLMC_EXP_MIN));
  __m256i ni = _mm256_cvttps_epi32(
      _mm256_sub_ps(_mm256_mul_ps(x, _mm256_set1_ps(LLMC_EXP_LOG2E)), _mm256_set1_ps(0.5f)));
  __m256 n = _mm256_cvtepi32_ps(ni);
  __m256 r = _mm256_add_ps(_mm256_fnmadd_ps(n, _mm256_set1_ps(LLMC_EXP_LN2_HI), x),
                           _mm256_mul_ps(n, _mm256_set1_ps(LLMC_EXP_LN2_LO)));
  __m256 p = llmc_exp_poly8(r);
  __m256 two_n = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(p, two_n);
}

/* llmc_exp_nonpositive on 8 lanes: the same reduction, polynomial and clamp. */
static inline __m256 llmc_exp_nonpositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(LLMC_EXP_MIN));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LLMC_EXP_LOG2E)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LLMC_EXP_LN2_HI), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(LLMC_EXP_LN2_LO), r);
  __m256 p = llmc_exp_poly8(r);
  __m256 two_n = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(p, two_n);
}
#endif

#if defined(__AVX512F__)
/* llmc_exp_nonpositive on 16 lanes: the same reduction, polynomial and clamp. */
static inline __m512 llmc_exp_nonpositive16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(LLMC_EXP_MIN));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LLMC_EXP_LOG2E)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LLMC_EXP_LN2_HI), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(LLMC_EXP_LN2_LO), r);
  __m512 p = _mm512_set1_ps(LLMC_EXP_P0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LLMC_EXP_P1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LLMC_EXP_P2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LLMC_EXP_P3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LLMC_EXP_P4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LLMC_EXP_P5));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
#endif

#endif
