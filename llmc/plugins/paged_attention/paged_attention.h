/* The C interface of the CPU paged-attention kernel (paged_attention.c), shared by the ctypes
 * binding (cpu.py) and the ONNX Runtime custom op (ort_op.c). */
#ifndef LLMC_PAGED_ATTENTION_H
#define LLMC_PAGED_ATTENTION_H

#include <stdint.h>

enum {
  PA_OK = 0,
  PA_BAD_QUERY_START_LOC = 1, /* not 0 .. T, or decreasing */
  PA_BAD_SEQ_LEN = 2,         /* shorter than its new tokens, or longer than its block table */
  PA_BAD_BLOCK_ID = 3,        /* a block id the context uses is outside the cache */
  PA_BAD_SLOT = 4,            /* a slot outside the cache */
  PA_BAD_CACHE_DTYPE = 5,     /* not one of the PA_CACHE_* below */
};

/* Element types of the KV cache (cpu.py's _CACHE_DTYPE_CODES). */
enum {
  PA_CACHE_F32 = 0,
  PA_CACHE_FP8_E4M3FN = 1, /* the OCP 8-bit floating point spec's E4M3: bias 7, no infinities,
                              NaN = S.1111.111, max normal 448 (Micikevicius et al. 2022, "FP8
                              Formats for Deep Learning") */
  PA_CACHE_INT8 = 2,       /* symmetric: zero point 0, range [-127, 127] */
};

/* How much a call may round (oneDNN's fpmath_mode): PA_FPMATH_STRICT computes in float32;
 * PA_FPMATH_BF16 lets prefill tiles round q, k, v and the softmax weights to bfloat16 (sums stay
 * float32) where the host has AMX-BF16 -- elsewhere it computes as strict. */
enum { PA_FPMATH_STRICT = 0, PA_FPMATH_BF16 = 1 };

/* One unit of a call's work; the kernel hands item indices [0, num_items) to a runner. */
typedef void (*llmc_pa_item_fn)(const void *ctx, int64_t item);

/* How a call runs its items in parallel: run(runner, fn, ctx, n) calls fn(ctx, i) once for each
 * i in [0, n), in any order on any threads, and returns when all have returned. */
struct llmc_pa_parallel {
  void (*run)(void *runner, llmc_pa_item_fn fn, const void *ctx, int64_t num_items);
  void *runner;
};

/* One layer of one step; see paged_attention.c. Returns PA_OK or a PA_BAD_* code (nothing is
 * written then). With parallel NULL (the ctypes binding, cpu.py) the items run on the kernel's
 * own thread pool. */
int llmc_paged_attention_on(const struct llmc_pa_parallel *parallel, const float *q,
                            int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                            int64_t v_stride, void *key_cache, void *value_cache,
                            int64_t num_blocks, int block_size, const int32_t *seq_lens,
                            const int32_t *query_start_loc, const int32_t *block_tables,
                            int64_t block_table_stride, int max_blocks,
                            const int64_t *slot_mapping, float *out, int num_tokens,
                            int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                            float scale, int sliding_window, float softcap, int cache_dtype,
                            float k_scale, float v_scale, int fpmath_mode);

/* What a PA_BAD_* status blames, as a sentence about the input. */
const char *llmc_pa_status_message(int status);

#endif
