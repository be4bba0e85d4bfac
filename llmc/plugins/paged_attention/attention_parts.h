/* What the parts of the CPU attention kernel share: the tile sizes, the SIMD paths the build
 * targets (the same in every part), and the functions one part calls in another. Internal: the
 * C interface is paged_attention.h. */
#ifndef LLMC_PA_ATTENTION_PARTS_H
#define LLMC_PA_ATTENTION_PARTS_H

#include <stdint.h>

#include "kv_codes.h"
#include "paged_attention.h"

/* Keys per softmax update. Why tiles: the accumulator is rescaled once per tile, not per key;
 * why 32: a tile's K and V rows (32 KB each at D=256, one KV head) stay close to L1. */
#define TILE 32

/* Query rows of a prefill tile: QUERY_ROWS / G tokens of one sequence times the G heads of their
 * GQA group. Why 32: per key the scores of 32 rows fill four 256-bit registers (two of 512), and
 * a tile of 8 Gemma 3 tokens (G = 4) reuses each K/V row read from the paged cache 32 times
 * instead of 4, while the masked triangle on the diagonal stays small. */
#define QUERY_ROWS 32

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LLMC_PA_AVX2 1
#endif

#if defined(LLMC_PA_AVX2) && defined(__AVX512F__)
#define LLMC_PA_AVX512 1
#endif

/* Prefill tiles on AMX-BF16 (prefill_amx.c) where the compiler targets it; whether Linux grants
 * this process the tiles is asked at run time (llmc_pa_amx_bf16_available). */
#if defined(LLMC_PA_AVX512) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__AVX512BF16__) && defined(__linux__)
#define LLMC_PA_AMX 1
#define AMX_KEYS 32    /* keys per chunk */
#define AMX_MAX_D 256 /* the largest head_dim the buffers hold */
#endif

#define LLMC_PA_INTERNAL __attribute__((visibility("hidden")))

/* Returns PA_OK, or the PA_BAD_* code of the first metadata that points outside the cache
 * (check_metadata.c). */
LLMC_PA_INTERNAL int llmc_pa_check_metadata(const int32_t *seq_lens,
                                            const int32_t *query_start_loc,
                                            const int32_t *block_tables,
                                            int64_t block_table_stride, int max_blocks,
                                            const int64_t *slot_mapping, int num_tokens,
                                            int num_seqs, int64_t num_blocks, int block_size);

/* One token, one GQA group: the G query heads that share KV head kvh, over context positions
 * first..last (decode.c). q and out point at the group's G*D contiguous floats; out is the
 * accumulator. kv views KV head kvh of the cache. */
LLMC_PA_INTERNAL void llmc_pa_attend_group(const float *restrict q, float *restrict out,
                                           const struct kv_view *kv,
                                           const int32_t *restrict block_table, int block_size,
                                           int group, int head_dim, int first, int last,
                                           float scale, float softcap);

/* num_queries consecutive tokens of one sequence (2 <= num_queries, num_queries * group <=
 * QUERY_ROWS), one GQA group, in float32 (prefill_tiles.c): llmc_pa_attend_group for all of
 * them at once. The first token sits at `position`; token i reads q + i * q_stride and writes
 * out + i * out_stride (G*D floats each). */
LLMC_PA_INTERNAL void llmc_pa_attend_tile(const float *restrict q, int64_t q_stride,
                                          float *restrict out, int64_t out_stride,
                                          const struct kv_view *kv,
                                          const int32_t *restrict block_table, int block_size,
                                          int group, int head_dim, int num_queries, int position,
                                          int sliding_window, float scale, float softcap);

#ifdef LLMC_PA_AMX
/* Whether Linux grants this process AMX tile data (asked once; prefill_amx.c). */
LLMC_PA_INTERNAL int llmc_pa_amx_bf16_available(void);

/* llmc_pa_attend_tile's contract and result (to bf16 rounding), head_dim % 32 == 0 and <=
 * AMX_MAX_D, on the AMX tiles of a host llmc_pa_amx_bf16_available() granted
 * (prefill_amx.c). */
LLMC_PA_INTERNAL void llmc_pa_attend_tile_amx(const float *restrict q, int64_t q_stride,
                                              float *restrict out, int64_t out_stride,
                                              const struct kv_view *kv,
                                              const int32_t *restrict block_table,
                                              int block_size, int group, int head_dim,
                                              int num_queries, int position,
                                              int sliding_window, float scale, float softcap);
#endif

#endif
