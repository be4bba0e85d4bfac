/* What the parts of the block-wise int8 product share (int8_matmul.c: packing and activations;
 * vnni.c: the VNNI and portable tiles; avx2.c: the AVX2 tiles; amx.c: the AMX tiles): the SIMD paths the build targets,
 * the packed panel's size, and the GELU-gated output. Internal: the C interface is
 * int8_matmul.h. */
#ifndef LLMC_INT8_MATMUL_INTERNAL_H
#define LLMC_INT8_MATMUL_INTERNAL_H

#include <stdint.h>

#include "int8_matmul.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define I8MM_VNNI 1
#else
#define I8MM_VNNI 0
#endif

/* AVX2 tiles (avx2.c) where the build targets AVX2 and FMA but not AVX-512 VNNI. */
#if !I8MM_VNNI && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define I8MM_AVX2 1
#else
#define I8MM_AVX2 0
#endif

/* AMX where the compiler targets it (-march=native on a host that has it); whether the OS lets
 * this process use the tiles is asked at run time (i8mm_amx_rows). */
#if I8MM_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define I8MM_AMX 1
#else
#define I8MM_AMX 0
#endif

#if I8MM_VNNI || I8MM_AVX2
/* The same 256 bytes of the next panel, into L1 (hint _MM_HINT_T0) or L2 (_MM_HINT_T1): a
 * thread runs panels in memory order, and on a weight larger than L2 (a vocabulary projection)
 * the first tile of each panel otherwise waits on memory (an Intel Xeon, into L1: 1.24x on a
 * [640, 262144] projection at M = 16, nothing lost at M = 128). Where the tiles prefetch, and
 * into which level, is panel_prefetch's choice (vnni.c). A prefetch past the last panel is
 * dropped, never a fault. */
#define PREFETCH_NEXT_PANEL(p, hint)                  \
  do {                                                \
    _mm_prefetch((const char *)(p), hint);            \
    _mm_prefetch((const char *)(p) + 64, hint);       \
    _mm_prefetch((const char *)(p) + 128, hint);      \
    _mm_prefetch((const char *)(p) + 192, hint);      \
  } while (0)
#endif

/* i8mm_weights.prefetch of this CPU (int8_matmul.c). */
__attribute__((visibility("hidden"))) int i8mm_prefetch_helps(void);

/* Bytes of one packed panel of a k-row weight: [k / 4][I8MM_PANEL][4] int8. */
#define PANEL_BYTES(k) ((k) / 4 * I8MM_PANEL * 4)

/* Index of panel p's block g in i8mm_weights.scales ([num_panels][num_blocks][64]). */
#define PANEL_BLOCK(w, p, g) (((p) * (w)->num_blocks + (g)) * I8MM_PANEL)

/* Rows [m0, m0 + rows) (rows <= I8MM_TILE_ROWS) x panel p on the AVX2 tiles into dst (their
 * first element), rows ld floats apart: vnni.c's tile, bit for bit. */
__attribute__((visibility("hidden"))) void i8mm_tile_avx2(const struct i8mm_weights *w,
                                                          const int8_t *qa, const float *sa,
                                                          int64_t m0, int64_t rows, int64_t p,
                                                          float *dst, int64_t ld);

/* ---- GELU-gated output ------------------------------------------------------------------------
 * A gated MLP's fused [gate | up] projection whose consumer wants gelu_tanh(gate) * up: each
 * gated item (i8mm_gated_item in vnni.c, i8mm_amx_gated_item in amx.c) computes panel q of the
 * gate half and its partner q + num_panels / 2 of the up half for the same rows into two local
 * tiles, and writes only their product: [m][n / 2] floats leave the kernel instead of [m][n]
 * (half the output traffic; the consumer also reads half), and the GELU runs on data still in
 * L1. Needs n % 128 == 0 (whole panels in both halves). */

/* out [rows][n / 2] at (m0, q * 64) = gelu_tanh(gate) * up of two [rows][64] tiles. */
__attribute__((visibility("hidden"))) void i8mm_gate_tiles(const struct i8mm_weights *w,
                                                           int64_t rows, int64_t m0, int64_t q,
                                                           const float *gate, const float *up,
                                                           float *y);

#endif
