/* The CPU paged-attention kernel's decode alone, on one core: one new token of each of S
 * sequences against its ctx-token context (Gemma 3 270M's group: 4 query heads sharing one
 * 256-wide KV head, 16-token blocks, a float32 cache), over L layers whose caches are apart in
 * memory (L = 18: 2 x 18 x S x ctx KB, from memory as in a serving step; L = 1 and a small
 * S x ctx: from the caches, the arithmetic alone). Best of 20 passes, and beside it the best of
 * 10 passes of a plain sum over the same bytes (the core's read bandwidth).
 *
 *     P=llmc/plugins
 *     gcc -O3 -fopenmp-simd -march=native -fno-math-errno -I$P/paged_attention -I$P \
 *         benchmarks/bench_decode_attention.c $P/paged_attention/decode.c \
 *         $P/paged_attention/kv_codes.c -lm -o /tmp/bench_decode_attention
 *     /tmp/bench_decode_attention 16 192 18     # S ctx L: a 16-sequence decode step
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attention_parts.h"

enum { HEAD_DIM = 256, GROUP = 4, BLOCK = 16 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static float *random_floats(size_t n) {
  float *x = aligned_alloc(64, (n * sizeof *x + 63) / 64 * 64);
  if (x == NULL) exit(1);
  for (size_t i = 0; i < n; ++i) x[i] = (float)(rand() % 100) * 0.01f;
  return x;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s S CTX L\n", argv[0]);
    return 2;
  }
  int seqs = atoi(argv[1]), ctx = atoi(argv[2]), layers = atoi(argv[3]);
  int blocks = (ctx + BLOCK - 1) / BLOCK;
  size_t per_layer = (size_t)seqs * blocks * BLOCK * HEAD_DIM;
  float **keys = malloc(layers * sizeof *keys), **values = malloc(layers * sizeof *values);
  for (int l = 0; l < layers; ++l) {
    keys[l] = random_floats(per_layer);
    values[l] = random_floats(per_layer);
  }
  int32_t *table = malloc((size_t)seqs * blocks * sizeof *table);
  for (int i = 0; i < seqs * blocks; ++i) table[i] = i;
  float *q = random_floats(GROUP * HEAD_DIM), *out = random_floats(GROUP * HEAD_DIM);
  double best = 1e30;
  for (int pass = 0; pass < 20; ++pass) {
    double start = now();
    for (int l = 0; l < layers; ++l)
      for (int s = 0; s < seqs; ++s) {
        struct kv_view kv = {keys[l], values[l], HEAD_DIM, PA_CACHE_F32, 1.f, 1.f};
        llmc_pa_attend_group(q, out, &kv, table + s * blocks, BLOCK, GROUP, HEAD_DIM, 0,
                             ctx - 1, 0.0625f, 0.f);
      }
    double seconds = now() - start;
    if (seconds < best) best = seconds;
  }
  double bytes = 2.0 * layers * seqs * ctx * HEAD_DIM * sizeof(float);
  printf("S=%d ctx=%d L=%d: %.3f ms, %.1f GB/s of cache (%.0f MB)\n", seqs, ctx, layers,
         best * 1e3, bytes / best / 1e9, bytes / 1e6);
  double read = 1e30, sink = 0;
  for (int pass = 0; pass < 10; ++pass) {
    double start = now();
    for (int l = 0; l < layers; ++l)
      for (int s = 0; s < seqs; ++s) {
        const float *k = keys[l] + (size_t)s * blocks * BLOCK * HEAD_DIM;
        const float *v = values[l] + (size_t)s * blocks * BLOCK * HEAD_DIM;
        float a = 0.f, b = 0.f;
#pragma omp simd reduction(+ : a, b)
        for (size_t i = 0; i < (size_t)ctx * HEAD_DIM; ++i) {
          a += k[i];
          b += v[i];
        }
        sink += a + b;
      }
    double seconds = now() - start;
    if (seconds < read) read = seconds;
  }
  printf("plain read of the same bytes: %.3f ms, %.1f GB/s (sum %g)\n", read * 1e3,
         bytes / read / 1e9, sink);
  return 0;
}
