/* Per-row sums of an accuracy report (llmc/calibration/accuracy.py) over two logits matrices in
 * three vector passes a row: reference x and candidate y [rows, V] float32, the token each row
 * predicts t. Per row r (out[4 r .. 4 r + 3], float64):
 *   0: lse(x) - x[t]   the reference's negative log-likelihood of t
 *   1: lse(y) - y[t]   the candidate's
 *   2: KL(softmax(x) || softmax(y))
 *   3: 1 when argmax x == argmax y (the first maximum of each), else 0
 *
 * The KL is taken as accuracy.py's torch form takes it: with p = softmax(x), d = y - x and c the
 * p-weighted mean of d, KL = log(1 + sum p expm1(d - c)) - sum p (d - c), exactly for any c;
 * centred, both sums are of small terms, so KL keeps its relative precision at per-row KL 1e-6
 * whatever the logits' shift or scale. lse(y) = lse(x) + c + log(1 + sum p expm1(d - c)). Where
 * a reference logit is -inf (p = 0) the candidate's mass there, exp(y - max x - c) / sum e,
 * joins that sum: it raises lse(y) and the KL (which is then sum p log(p / q) over p's support).
 * Passes: (1) max and argmax of x and y; (2) e = exp(x - max x), sum e, sum e d -> c; (3) sum e
 * expm1(d - c) and sum e (d - c). expm1 is a degree-7 Taylor polynomial for |u| < 1/4 (relative
 * error < 2e-9) and exp(u) - 1 beyond; exp is simd_math.h's (relative error < 1e-7). Lanes
 * accumulate in float32 over blocks of LS_BLOCK elements and the blocks in float64; AVX-512 and
 * AVX2 bodies, scalar tails (and a scalar build). Rows run on the kernel's thread pool. */
#include <math.h>
#include <stdint.h>

#include "../paged_attention/thread_pool.h"
#include "../simd_math.h"

#define LS_BLOCK 2048
#define LS_EXPM1_POLY_BOUND 0.25f
#define LS_EXP_MAX 80.0f

typedef struct {
  const float *x, *y;
  const int64_t *targets;
  int64_t vocab;
  double *out;
} ls_args;

/* expm1(u) by its Taylor series to u^7, for |u| < LS_EXPM1_POLY_BOUND. */
static inline float ls_expm1_poly(float u) {
  float p = 1.0f / 5040.0f;
  p = p * u + 1.0f / 720.0f;
  p = p * u + 1.0f / 120.0f;
  p = p * u + 1.0f / 24.0f;
  p = p * u + 1.0f / 6.0f;
  p = p * u + 0.5f;
  return (p * u) * u + u;
}

static inline float ls_exp(float v) {  /* exp(v) for v <= LS_EXP_MAX */
  return llmc_exp_nonpositive(v < LS_EXP_MAX ? v : LS_EXP_MAX);
}

static inline float ls_expm1(float u) {
  return fabsf(u) < LS_EXPM1_POLY_BOUND ? ls_expm1_poly(u) : ls_exp(u) - 1.0f;
}

/* Pass 1 on elements [i0, n): running max and first argmax of x and y. */
static void ls_max_tail(const float *x, const float *y, int64_t i0, int64_t n, float *mx,
                        int64_t *ax, float *my, int64_t *ay) {
  for (int64_t i = i0; i < n; i++) {
    if (x[i] > *mx) *mx = x[i], *ax = i;
    if (y[i] > *my) *my = y[i], *ay = i;
  }
}

/* Pass 2 on elements [i0, n): sums of e and e d. */
static void ls_centre_tail(const float *x, const float *y, int64_t i0, int64_t n, float mx,
                           double *se, double *sed) {
  for (int64_t i = i0; i < n; i++) {
    if (x[i] == -INFINITY) continue;
    float e = ls_exp(x[i] - mx);
    *se += e;
    *sed += (double)e * (y[i] - x[i]);
  }
}

/* Pass 3 on elements [i0, n): sums of e expm1(d - c) and e (d - c). */
static void ls_spread_tail(const float *x, const float *y, int64_t i0, int64_t n, float mx,
                           float c, double *sem, double *seu) {
  for (int64_t i = i0; i < n; i++) {
    if (x[i] == -INFINITY) {  /* p = 0, while q may hold mass there */
      *sem += ls_exp(y[i] - mx - c);
      continue;
    }
    float e = ls_exp(x[i] - mx), u = (y[i] - x[i]) - c;
    *sem += (double)e * ls_expm1(u);
    *seu += (double)e * u;
  }
}

#if defined(__AVX512F__)
#define LS_LANES 16
static inline double ls_hsum(__m512 v) { return (double)_mm512_reduce_add_ps(v); }

static void ls_max(const float *x, const float *y, int64_t n, float *mx, int64_t *ax, float *my,
                   int64_t *ay) {
  int64_t body = n - n % LS_LANES;
  __m512 vx = _mm512_set1_ps(-INFINITY), vy = vx;
  for (int64_t i = 0; i < body; i += LS_LANES) {
    vx = _mm512_max_ps(vx, _mm512_loadu_ps(x + i));
    vy = _mm512_max_ps(vy, _mm512_loadu_ps(y + i));
  }
  *mx = _mm512_reduce_max_ps(vx), *my = _mm512_reduce_max_ps(vy), *ax = -1, *ay = -1;
  /* the first index holding each maximum */
  for (int64_t i = 0; i < body && (*ax < 0 || *ay < 0); i++) {
    if (*ax < 0 && x[i] == *mx) *ax = i;
    if (*ay < 0 && y[i] == *my) *ay = i;
  }
  if (*ax < 0) *mx = -INFINITY;
  if (*ay < 0) *my = -INFINITY;
  ls_max_tail(x, y, body, n, mx, ax, my, ay);
}

static inline __m512 ls_exp16(__m512 v) {
  return llmc_exp_nonpositive16(_mm512_min_ps(v, _mm512_set1_ps(LS_EXP_MAX)));
}

static void ls_centre(const float *x, const float *y, int64_t n, float mx, double *se,
                      double *sed) {
  int64_t body = n - n % LS_LANES;
  const __m512 vmx = _mm512_set1_ps(mx), ninf = _mm512_set1_ps(-INFINITY);
  for (int64_t b = 0; b < body; b += LS_BLOCK) {
    int64_t end = b + LS_BLOCK < body ? b + LS_BLOCK : body;
    __m512 ae = _mm512_setzero_ps(), aed = _mm512_setzero_ps();
    for (int64_t i = b; i < end; i += LS_LANES) {
      __m512 vx = _mm512_loadu_ps(x + i), vy = _mm512_loadu_ps(y + i);
      __mmask16 live = _mm512_cmp_ps_mask(vx, ninf, _CMP_NEQ_OQ);
      __m512 e = _mm512_maskz_mov_ps(live, ls_exp16(_mm512_sub_ps(vx, vmx)));
      __m512 d = _mm512_maskz_sub_ps(live, vy, vx);
      ae = _mm512_add_ps(ae, e);
      aed = _mm512_fmadd_ps(e, d, aed);
    }
    *se += ls_hsum(ae), *sed += ls_hsum(aed);
  }
  ls_centre_tail(x, y, body, n, mx, se, sed);
}

static void ls_spread(const float *x, const float *y, int64_t n, float mx, float c, double *sem,
                      double *seu) {
  int64_t body = n - n % LS_LANES;
  const __m512 vmx = _mm512_set1_ps(mx), vc = _mm512_set1_ps(c), ninf = _mm512_set1_ps(-INFINITY);
  const __m512 vmc = _mm512_set1_ps(mx + c);
  const __m512 bound = _mm512_set1_ps(LS_EXPM1_POLY_BOUND), one = _mm512_set1_ps(1.0f);
  for (int64_t b = 0; b < body; b += LS_BLOCK) {
    int64_t end = b + LS_BLOCK < body ? b + LS_BLOCK : body;
    __m512 aem = _mm512_setzero_ps(), aeu = _mm512_setzero_ps();
    for (int64_t i = b; i < end; i += LS_LANES) {
      __m512 vx = _mm512_loadu_ps(x + i), vy = _mm512_loadu_ps(y + i);
      __mmask16 live = _mm512_cmp_ps_mask(vx, ninf, _CMP_NEQ_OQ);
      __m512 e = _mm512_maskz_mov_ps(live, ls_exp16(_mm512_sub_ps(vx, vmx)));
      __m512 u = _mm512_maskz_sub_ps(live, _mm512_sub_ps(vy, vx), vc);
      __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
      p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(1.0f / 720.0f));
      p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(1.0f / 120.0f));
      p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(1.0f / 24.0f));
      p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(1.0f / 6.0f));
      p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(0.5f));
      __m512 em1 = _mm512_fmadd_ps(_mm512_mul_ps(p, u), u, u);
      __mmask16 far = _mm512_cmp_ps_mask(_mm512_abs_ps(u), bound, _CMP_GE_OQ);
      if (far) em1 = _mm512_mask_mov_ps(em1, far, _mm512_sub_ps(ls_exp16(u), one));
      aem = _mm512_fmadd_ps(e, em1, aem);
      __mmask16 dead = (__mmask16)~live;  /* p = 0, while q may hold mass there */
      if (dead) aem = _mm512_mask_add_ps(aem, dead, aem, ls_exp16(_mm512_sub_ps(vy, vmc)));
      aeu = _mm512_fmadd_ps(e, u, aeu);
    }
    *sem += ls_hsum(aem), *seu += ls_hsum(aeu);
  }
  ls_spread_tail(x, y, body, n, mx, c, sem, seu);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define LS_LANES 8
static inline double ls_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return (double)_mm_cvtss_f32(s);
}

static inline float ls_hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static void ls_max(const float *x, const float *y, int64_t n, float *mx, int64_t *ax, float *my,
                   int64_t *ay) {
  int64_t body = n - n % LS_LANES;
  __m256 vx = _mm256_set1_ps(-INFINITY), vy = vx;
  for (int64_t i = 0; i < body; i += LS_LANES) {
    vx = _mm256_max_ps(vx, _mm256_loadu_ps(x + i));
    vy = _mm256_max_ps(vy, _mm256_loadu_ps(y + i));
  }
  *mx = ls_hmax(vx), *my = ls_hmax(vy), *ax = -1, *ay = -1;
  for (int64_t i = 0; i < body && (*ax < 0 || *ay < 0); i++) {
    if (*ax < 0 && x[i] == *mx) *ax = i;
    if (*ay < 0 && y[i] == *my) *ay = i;
  }
  if (*ax < 0) *mx = -INFINITY;
  if (*ay < 0) *my = -INFINITY;
  ls_max_tail(x, y, body, n, mx, ax, my, ay);
}

static inline __m256 ls_exp8(__m256 v) {
  return llmc_exp_nonpositive8(_mm256_min_ps(v, _mm256_set1_ps(LS_EXP_MAX)));
}

static void ls_centre(const float *x, const float *y, int64_t n, float mx, double *se,
                      double *sed) {
  int64_t body = n - n % LS_LANES;
  const __m256 vmx = _mm256_set1_ps(mx), ninf = _mm256_set1_ps(-INFINITY);
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t b = 0; b < body; b += LS_BLOCK) {
    int64_t end = b + LS_BLOCK < body ? b + LS_BLOCK : body;
    __m256 ae = zero, aed = zero;
    for (int64_t i = b; i < end; i += LS_LANES) {
      __m256 vx = _mm256_loadu_ps(x + i), vy = _mm256_loadu_ps(y + i);
      __m256 live = _mm256_cmp_ps(vx, ninf, _CMP_NEQ_OQ);
      __m256 e = _mm256_and_ps(live, ls_exp8(_mm256_sub_ps(vx, vmx)));
      __m256 d = _mm256_and_ps(live, _mm256_sub_ps(vy, vx));
      ae = _mm256_add_ps(ae, e);
      aed = _mm256_fmadd_ps(e, d, aed);
    }
    *se += ls_hsum(ae), *sed += ls_hsum(aed);
  }
  ls_centre_tail(x, y, body, n, mx, se, sed);
}

static void ls_spread(const float *x, const float *y, int64_t n, float mx, float c, double *sem,
                      double *seu) {
  int64_t body = n - n % LS_LANES;
  const __m256 vmx = _mm256_set1_ps(mx), vc = _mm256_set1_ps(c), ninf = _mm256_set1_ps(-INFINITY);
  const __m256 vmc = _mm256_set1_ps(mx + c), one = _mm256_set1_ps(1.0f);
  const __m256 bound = _mm256_set1_ps(LS_EXPM1_POLY_BOUND), sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < body; b += LS_BLOCK) {
    int64_t end = b + LS_BLOCK < body ? b + LS_BLOCK : body;
    __m256 aem = _mm256_setzero_ps(), aeu = _mm256_setzero_ps();
    for (int64_t i = b; i < end; i += LS_LANES) {
      __m256 vx = _mm256_loadu_ps(x + i), vy = _mm256_loadu_ps(y + i);
      __m256 live = _mm256_cmp_ps(vx, ninf, _CMP_NEQ_OQ);
      __m256 e = _mm256_and_ps(live, ls_exp8(_mm256_sub_ps(vx, vmx)));
      __m256 u = _mm256_and_ps(live, _mm256_sub_ps(_mm256_sub_ps(vy, vx), vc));
      __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
      p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(1.0f / 720.0f));
      p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(1.0f / 120.0f));
      p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(1.0f / 24.0f));
      p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(1.0f / 6.0f));
      p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(0.5f));
      __m256 em1 = _mm256_fmadd_ps(_mm256_mul_ps(p, u), u, u);
      __m256 far = _mm256_cmp_ps(_mm256_andnot_ps(sign, u), bound, _CMP_GE_OQ);
      if (_mm256_movemask_ps(far))
        em1 = _mm256_blendv_ps(em1, _mm256_sub_ps(ls_exp8(u), one), far);
      aem = _mm256_fmadd_ps(e, em1, aem);
      if (_mm256_movemask_ps(live) != 0xff)  /* p = 0, while q may hold mass there */
        aem = _mm256_add_ps(aem, _mm256_andnot_ps(live, ls_exp8(_mm256_sub_ps(vy, vmc))));
      aeu = _mm256_fmadd_ps(e, u, aeu);
    }
    *sem += ls_hsum(aem), *seu += ls_hsum(aeu);
  }
  ls_spread_tail(x, y, body, n, mx, c, sem, seu);
}
#else
static void ls_max(const float *x, const float *y, int64_t n, float *mx, int64_t *ax, float *my,
                   int64_t *ay) {
  *mx = -INFINITY, *my = -INFINITY, *ax = -1, *ay = -1;
  ls_max_tail(x, y, 0, n, mx, ax, my, ay);
}

static void ls_centre(const float *x, const float *y, int64_t n, float mx, double *se,
                      double *sed) {
  ls_centre_tail(x, y, 0, n, mx, se, sed);
}

static void ls_spread(const float *x, const float *y, int64_t n, float mx, float c, double *sem,
                      double *seu) {
  ls_spread_tail(x, y, 0, n, mx, c, sem, seu);
}
#endif

static void ls_row(const void *ctx, int64_t r) {
  const ls_args *a = (const ls_args *)ctx;
  const float *x = a->x + r * a->vocab, *y = a->y + r * a->vocab;
  int64_t t = a->targets[r], ax, ay;
  float mx, my;
  double se = 0.0, sed = 0.0, sem = 0.0, seu = 0.0;
  ls_max(x, y, a->vocab, &mx, &ax, &my, &ay);
  ls_centre(x, y, a->vocab, mx, &se, &sed);
  double c = sed / se;
  ls_spread(x, y, a->vocab, mx, (float)c, &sem, &seu);
  double log_ratio = log1p(sem / se), lse_x = mx + log(se);
  double *out = a->out + 4 * r;
  out[0] = lse_x - x[t];
  out[1] = lse_x + c + log_ratio - y[t];
  out[2] = log_ratio - seu / se;
  out[3] = ax == ay ? 1.0 : 0.0;
}

/* out[4 r + k] for each row r (see the file's comment); targets in [0, vocab). */
void llmc_logit_row_sums(const float *x, const float *y, const int64_t *targets, int64_t rows,
                         int64_t vocab, double *out) {
  ls_args a = {x, y, targets, vocab, out};
  llmc_pa_parallel_for(ls_row, &a, rows);
}
