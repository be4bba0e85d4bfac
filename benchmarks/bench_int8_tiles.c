/* BlockInt8MatMul's tiles alone, on one core: a random [k, n] 8-bit weight in blocks of 32
 * packed by i8mm_pack, m rows quantized once, then every work item of the product (i8mm_item,
 * or i8mm_gated_item with a fourth argument), best of 15 passes. A weight larger than the caches
 * (Gemma 3 270M's vocabulary projection: 640 x 262144) streams from memory in every pass; a
 * small one stays in L2/L3, so its figure is the tiles' arithmetic alone.
 *
 *     K=llmc/plugins/int8_matmul
 *     gcc -O3 -march=native -fno-math-errno -I$K benchmarks/bench_int8_tiles.c $K/int8_matmul.c \
 *         $K/vnni.c $K/avx2.c $K/amx.c -lm -o /tmp/bench_int8_tiles
 *     /tmp/bench_int8_tiles 16 640 262144     # m k n: a 16-sequence decode's projection
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "int8_matmul.h"

enum { BLOCK = 32, PASSES = 15 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s M K N [gated]\n", argv[0]);
    return 2;
  }
  long m = atol(argv[1]), k = atol(argv[2]), n = atol(argv[3]);
  int gated = argc > 4;
  uint8_t *b = malloc((size_t)(n * k));
  float *scales = malloc((size_t)(n * (k / BLOCK)) * sizeof *scales);
  float *a = malloc((size_t)(m * k) * sizeof *a);
  int8_t *qa = malloc((size_t)(m * k));
  float *sa = malloc((size_t)(m * (k / BLOCK)) * sizeof *sa);
  int32_t *za = malloc((size_t)(m * (k / BLOCK)) * sizeof *za);
  float *y = malloc((size_t)(m * n) * sizeof *y);
  if (!b || !scales || !a || !qa || !sa || !za || !y) return 1;
  srand(1);
  for (long i = 0; i < n * k; ++i) b[i] = (uint8_t)rand();
  for (long i = 0; i < n * (k / BLOCK); ++i) scales[i] = 0.01f;
  for (long i = 0; i < m * k; ++i) a[i] = (float)(rand() % 200 - 100) * 0.01f;
  struct i8mm_weights w;
  if (i8mm_pack(&w, b, scales, k, n, BLOCK) != I8MM_OK) return 1;
  i8mm_quantize_rows(&w, a, I8MM_INPUT_PLAIN, 0, m, qa, sa, za);
  long items = gated ? i8mm_gated_num_items(&w, m) : i8mm_num_items(&w, m);
  double best = 1e30;
  for (int pass = 0; pass < PASSES; ++pass) {
    double start = now();
    for (long i = 0; i < items; ++i) {
      if (gated)
        i8mm_gated_item(&w, qa, sa, za, m, i, y);
      else
        i8mm_item(&w, qa, sa, za, m, i, y);
    }
    double seconds = now() - start;
    if (seconds < best) best = seconds;
  }
  printf("m=%ld k=%ld n=%ld%s prefetch=%d: %.3f ms, %.1f GMAC/s, weights %.1f GB/s\n", m, k, n,
         gated ? " gated" : "", w.prefetch, best * 1e3, (double)m * k * n / best / 1e9,
         (double)n * k * (1 + 4.0 / BLOCK) / best / 1e9);
  i8mm_free(&w);
  return 0;
}
