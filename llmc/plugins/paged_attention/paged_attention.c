/* llmc::PagedAttention on the CPU: float32 activations, a float32, FP8 E4M3FN or int8 KV cache
 * (DESIGN §3; the ground truth is reference.py). This file holds the entry points and the
 * dispatch of a call's work items; the parts are
 *   check_metadata.c  the metadata checks, before anything is written;
 *   kv_codes.c        the quantized cache's write and read (kv_codes.h);
 *   decode.c          one new token against its context (llmc_pa_attend_group);
 *   prefill_tiles.c   a tile of new tokens in float32 (llmc_pa_attend_tile);
 *   prefill_amx.c     the same on AMX-BF16 tiles, fpmath_mode bf16 (llmc_pa_attend_tile_amx);
 *   thread_pool.c     the kernel's own worker threads (llmc_pa_parallel_for);
 * sharing attention_parts.h, and exp from ../simd_math.h.
 *
 * One call = one layer of one step: write the T new tokens' keys and values into the paged cache
 * in place, then let every new token attend causally over its sequence's context by walking the
 * block table. No copy of the cache and no gather of the context: each K/V row is read where it
 * lives. Scores use the online softmax of Milakov & Gimelshein 2018 ("Online normalizer
 * calculation for softmax") as tiled in FlashAttention (Dao et al. 2022): a running max and sum
 * per query head, the accumulator rescaled when the max grows, one tile of keys at a time.
 *
 * Activations are float32; the cache is float32, FP8 E4M3FN or int8 (--kv-cache-dtype). A
 * quantized cache holds q = saturate(round_half_even(x / scale)) with one scale per layer for
 * keys and one for values (vLLM's per-tensor k_scale / v_scale); a tile of it is decoded to
 * float32 rows, x = float(q) * scale, when it is read, and every computation after that is the
 * float32 path's. A float32 cache is read in place, as before.
 *
 * Built by setup.py as llmc/plugins/paged_attention/_paged_attention_cpu*.so (no PyInit: loaded
 * with ctypes by cpu.py), or by cpu.py itself with gcc when the extension is missing.
 */
#include <stdint.h>

#include "attention_parts.h"
#include "thread_pool.h"

#ifndef LLMC_PA_SOURCE_SHA256
#define LLMC_PA_SOURCE_SHA256 "unknown"
#endif

/* Below this many q.k multiply-adds (~10 us on one core) a step runs on the calling thread. Why:
 * waking the worker threads costs about as much, and far more when the cores are busy. */
#define PARALLEL_MIN_WORK (1 << 18)

/* Lets cpu.py tell a stale built extension from one built from the current source. */
const char *llmc_pa_source_sha256(void) { return LLMC_PA_SOURCE_SHA256; }

/* The sequence that owns packed item t (a token, a tile) given each sequence's first item: the
 * last b with starts[b] <= t. */
static int seq_of(const int32_t *starts, int num_seqs, int t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (starts[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/* Whether fpmath_mode PA_FPMATH_BF16 runs prefill tiles on AMX-BF16 here (built for it and
 * granted the tiles), for cpu.py and the tests. */
int llmc_pa_amx_bf16(void) {
#ifdef LLMC_PA_AMX
  return llmc_pa_amx_bf16_available();
#else
  return 0;
#endif
}

/* Everything one work item needs: the arguments of llmc_paged_attention_on plus the tiling. */
struct step_ctx {
  const float *q;
  int64_t q_stride;
  float *out;
  const void *key_cache, *value_cache;
  int cache_dtype;
  float k_scale, v_scale;
  const int32_t *seq_lens, *query_start_loc, *block_tables;
  int64_t block_table_stride;
  const int32_t *tile_start;
  int num_seqs, num_heads, num_kv_heads, head_dim, group, tile_tokens;
  int64_t row_stride;
  int block_size, sliding_window;
  float scale, softcap;
  int64_t num_items;
  int amx_bf16; /* prefill tiles on llmc_pa_attend_tile_amx */
};

/* Work item `index` (issued last tile first, see the caller): one tile of one sequence's new
 * tokens against one KV head. */
static void attend_item(const void *context, int64_t index) {
  const struct step_ctx *c = context;
  int64_t item = c->num_items - 1 - index;
  int tile = (int)(item / c->num_kv_heads), kvh = (int)(item % c->num_kv_heads);
  int b = seq_of(c->tile_start, c->num_seqs, tile);
  int t = c->query_start_loc[b] + (tile - c->tile_start[b]) * c->tile_tokens;
  int left = c->query_start_loc[b + 1] - t;
  int num_queries = left < c->tile_tokens ? left : c->tile_tokens;
  int position = c->seq_lens[b] - left;
  int group = c->group, head_dim = c->head_dim;
  int64_t head_offset = (int64_t)kvh * group * head_dim;
  const float *q_group = c->q + t * c->q_stride + head_offset;
  float *out_group = c->out + (int64_t)t * c->num_heads * head_dim + head_offset;
  size_t head_bytes = (size_t)kvh * head_dim * cache_itemsize(c->cache_dtype);
  struct kv_view kv = {(const char *)c->key_cache + head_bytes,
                       (const char *)c->value_cache + head_bytes, c->row_stride, c->cache_dtype,
                       c->k_scale, c->v_scale};
  const int32_t *block_table = c->block_tables + b * c->block_table_stride;
#ifdef LLMC_PA_AMX
  if (num_queries > 1 && c->amx_bf16) {
    llmc_pa_attend_tile_amx(q_group, c->q_stride, out_group, (int64_t)c->num_heads * head_dim,
                            &kv, block_table, c->block_size, group, head_dim, num_queries,
                            position, c->sliding_window, c->scale, c->softcap);
    return;
  }
#endif
  if (num_queries > 1) {
    llmc_pa_attend_tile(q_group, c->q_stride, out_group, (int64_t)c->num_heads * head_dim, &kv,
                        block_table, c->block_size, group, head_dim, num_queries, position,
                        c->sliding_window, c->scale, c->softcap);
  } else {
    int first = c->sliding_window > 0 && position - c->sliding_window + 1 > 0
                    ? position - c->sliding_window + 1
                    : 0;
    llmc_pa_attend_group(q_group, out_group, &kv, block_table, c->block_size, group, head_dim,
                         first, position, c->scale, c->softcap);
  }
}

/* Returns PA_OK, or a PA_BAD_* code before anything is written. parallel NULL: the items run on
 * the kernel's own thread pool (thread_pool.c). Strides are in elements. sliding_window <= 0
 * and softcap <= 0 mean off. The caches hold cache_dtype (PA_CACHE_*) elements; k_scale and
 * v_scale (> 0) are used by the quantized ones only. */
int llmc_paged_attention_on(const struct llmc_pa_parallel *parallel, const float *q,
                            int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                            int64_t v_stride, void *key_cache, void *value_cache,
                            int64_t num_blocks, int block_size, const int32_t *seq_lens,
                            const int32_t *query_start_loc, const int32_t *block_tables,
                            int64_t block_table_stride, int max_blocks,
                            const int64_t *slot_mapping, float *out, int num_tokens,
                            int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                            float scale, int sliding_window, float softcap, int cache_dtype,
                            float k_scale, float v_scale, int fpmath_mode) {
  if (cache_dtype != PA_CACHE_F32 && cache_dtype != PA_CACHE_FP8_E4M3FN &&
      cache_dtype != PA_CACHE_INT8) {
    return PA_BAD_CACHE_DTYPE;
  }
  int status = llmc_pa_check_metadata(seq_lens, query_start_loc, block_tables,
                                      block_table_stride, max_blocks, slot_mapping, num_tokens,
                                      num_seqs, num_blocks, block_size);
  if (status != PA_OK) return status;
  if (cache_dtype == PA_CACHE_FP8_E4M3FN) llmc_pa_fp8_table_init();

  int64_t row_stride = (int64_t)num_kv_heads * head_dim;
  size_t row_bytes = row_stride * cache_itemsize(cache_dtype);
  for (int t = 0; t < num_tokens; ++t) {
    llmc_pa_encode_row(k + t * k_stride, (char *)key_cache + slot_mapping[t] * row_bytes,
                       row_stride, cache_dtype, k_scale);
    llmc_pa_encode_row(v + t * v_stride, (char *)value_cache + slot_mapping[t] * row_bytes,
                       row_stride, cache_dtype, v_scale);
  }

  /* Work items: (tile of up to QUERY_ROWS / G consecutive new tokens of one sequence, KV head).
   * Why tiles: each K/V row read from the cache then serves all the tile's tokens
   * (llmc_pa_attend_tile); a one-token tile (a decode) runs llmc_pa_attend_group. Why KV heads
   * and tiles rather than whole sequences: a single prefill with MQA is one sequence and one KV
   * head, which would leave every core but one idle. Dynamic scheduling, last tiles first: a
   * prefill's later tokens see more context, so the costliest items go out first and the cheap
   * ones even out the end. */
  int group = num_heads / num_kv_heads;
  int tile_tokens = QUERY_ROWS / group > 1 ? QUERY_ROWS / group : 1;
  int32_t tile_start[num_seqs + 1]; /* prefix sums of the sequences' tile counts */
  int64_t work = 0;                 /* multiply-adds of q.k, an upper bound (windows ignored) */
  tile_start[0] = 0;
  for (int b = 0; b < num_seqs; ++b) {
    int num_new = query_start_loc[b + 1] - query_start_loc[b];
    tile_start[b + 1] = tile_start[b] + (num_new + tile_tokens - 1) / tile_tokens;
    work += (int64_t)num_new * seq_lens[b];
  }
  work *= (int64_t)num_heads * head_dim;
  int64_t num_items = (int64_t)tile_start[num_seqs] * num_kv_heads;
  struct step_ctx ctx = {q, q_stride, out, key_cache, value_cache, cache_dtype, k_scale,
                         v_scale, seq_lens, query_start_loc, block_tables, block_table_stride,
                         tile_start, num_seqs, num_heads, num_kv_heads, head_dim, group,
                         tile_tokens, row_stride, block_size, sliding_window, scale, softcap,
                         num_items, 0};
#ifdef LLMC_PA_AMX
  ctx.amx_bf16 = fpmath_mode == PA_FPMATH_BF16 && head_dim % 32 == 0 && head_dim <= AMX_MAX_D &&
                 llmc_pa_amx_bf16_available();
#endif
  if (work < PARALLEL_MIN_WORK || num_items < 2) {
    for (int64_t i = 0; i < num_items; ++i) attend_item(&ctx, i);
  } else if (parallel == NULL) {
    llmc_pa_parallel_for(attend_item, &ctx, num_items);
  } else {
    parallel->run(parallel->runner, attend_item, &ctx, num_items);
  }
  return PA_OK;
}
