/* llmc::PagedAttention as an ONNX Runtime custom op: the CPU kernel of paged_attention.c inside
 * an ORT session, its work items on ORT's intra-op thread pool (KernelContext_ParallelFor).
 *
 * Why: with the plugin outside ORT, a step is one ORT run per layer segment, and between runs
 * ORT's pool threads spin on the cores the kernel wants (DESIGN §6 runner). As an op, attention
 * is one more node of a single run per step.
 *
 * The KV caches are graph inputs that the op writes in place (the new tokens' slots only): the
 * runner feeds the same numpy arrays every step and ORT hands their memory to the op without a
 * copy (CPU tensors). Inputs, attributes and errors follow the ONNX schema in schema.py; a bad
 * block table or slot fails the run with ORT_INVALID_ARGUMENT before anything is written.
 *
 * Built by setup.py against onnxruntime_c_api.h (ORT_API_VERSION 21, from Debian's
 * libonnxruntime-dev; any later ORT runtime accepts an op of an older API version) and loaded
 * with SessionOptions.register_custom_ops_library. Entry point: RegisterCustomOps.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <onnxruntime_c_api.h>

#include "ort_custom_op.h"
#include "ort_matmul.h"
#include "ort_qkv_rope.h"
#include "ort_rms_norm.h"
#include "paged_attention.h"

#ifndef LLMC_ORT_OP_SOURCE_SHA256
#define LLMC_ORT_OP_SOURCE_SHA256 "unknown"
#endif

static const OrtApi *ort;

/* sha256 of the sources the library is built from (ort_op.py's OP_SOURCES checks it). */
const char *llmc_ort_op_source_sha256(void) { return LLMC_ORT_OP_SOURCE_SHA256; }

enum { IN_Q, IN_K, IN_V, IN_KEY_CACHE, IN_VALUE_CACHE, IN_SEQ_LENS, IN_QSL, IN_BT, IN_SLOTS, N_IN };

struct kernel {
  int64_t num_heads, num_kv_heads, head_dim, sliding_window, block_size;
  float scale, softcap, k_scale, v_scale;
  int cache_dtype;                /* PA_CACHE_* */
  int fpmath_mode;                /* PA_FPMATH_* */
  ONNXTensorElementDataType cache_type; /* the ONNX element type that cache_dtype requires */
};

#define fail(...) llmc_op_fail(ort, __VA_ARGS__)

/* ---- Attributes ---------------------------------------------------------------------------- */

static OrtStatus *get_int(const OrtKernelInfo *info, const char *name, int64_t *out) {
  return ort->KernelInfoGetAttribute_int64(info, name, out);
}

static OrtStatus *get_float(const OrtKernelInfo *info, const char *name, float fallback,
                            int optional, float *out) {
  OrtStatus *status = ort->KernelInfoGetAttribute_float(info, name, out);
  if (status != NULL && optional) {
    ort->ReleaseStatus(status);
    *out = fallback;
    return NULL;
  }
  return status;
}

/* Optional string attribute `name` into value[16]: `fallback` when absent, "(too long)" when it
 * does not fit (which no caller accepts: refused with the attribute's name, never taken for
 * absent). */
static OrtStatus *get_string(const OrtKernelInfo *info, const char *name, const char *fallback,
                             char value[16]) {
  size_t size = 0;
  OrtStatus *status = ort->KernelInfoGetAttribute_string(info, name, NULL, &size);
  if (status != NULL) { /* absent */
    ort->ReleaseStatus(status);
    strcpy(value, fallback);
    return NULL;
  }
  if (size > 16) {
    strcpy(value, "(too long)");
    return NULL;
  }
  return ort->KernelInfoGetAttribute_string(info, name, value, &size);
}

static OrtStatus *get_cache_dtype(const OrtKernelInfo *info, struct kernel *k) {
  char value[16];
  LLMC_TRY(get_string(info, "kv_cache_dtype", "auto", value));
  if (strcmp(value, "auto") == 0) {
    k->cache_dtype = PA_CACHE_F32;
    k->cache_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  } else if (strcmp(value, "fp8") == 0) {
    k->cache_dtype = PA_CACHE_FP8_E4M3FN;
    k->cache_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;
  } else if (strcmp(value, "int8") == 0) {
    k->cache_dtype = PA_CACHE_INT8;
    k->cache_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
  } else {
    return fail("PagedAttention: kv_cache_dtype must be auto, fp8 or int8, got '%s'", value);
  }
  return NULL;
}

/* fpmath_mode: optional, absent means "strict". */
static OrtStatus *get_fpmath_mode(const OrtKernelInfo *info, struct kernel *k) {
  char value[16];
  LLMC_TRY(get_string(info, "fpmath_mode", "strict", value));
  if (strcmp(value, "strict") == 0) {
    k->fpmath_mode = PA_FPMATH_STRICT;
  } else if (strcmp(value, "bf16") == 0) {
    k->fpmath_mode = PA_FPMATH_BF16;
  } else {
    return fail("PagedAttention: fpmath_mode must be strict or bf16, got '%s'", value);
  }
  return NULL;
}

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api,
                                             const OrtKernelInfo *info, void **out) {
  (void)op;
  (void)api;
  struct kernel k;
  LLMC_TRY(get_int(info, "num_heads", &k.num_heads));
  LLMC_TRY(get_int(info, "num_kv_heads", &k.num_kv_heads));
  LLMC_TRY(get_int(info, "head_dim", &k.head_dim));
  LLMC_TRY(get_int(info, "sliding_window", &k.sliding_window));
  LLMC_TRY(get_int(info, "block_size", &k.block_size));
  LLMC_TRY(get_float(info, "scale", 0.f, 0, &k.scale));
  LLMC_TRY(get_float(info, "logit_softcap", 0.f, 0, &k.softcap));
  LLMC_TRY(get_float(info, "k_scale", 1.f, 1, &k.k_scale));
  LLMC_TRY(get_float(info, "v_scale", 1.f, 1, &k.v_scale));
  LLMC_TRY(get_cache_dtype(info, &k));
  LLMC_TRY(get_fpmath_mode(info, &k));
  if (k.num_heads < 1 || k.num_kv_heads < 1 || k.num_heads % k.num_kv_heads != 0 ||
      k.head_dim < 1 || k.block_size < 1) {
    return fail("PagedAttention: bad attributes num_heads=%lld num_kv_heads=%lld head_dim=%lld "
                "block_size=%lld", (long long)k.num_heads, (long long)k.num_kv_heads,
                (long long)k.head_dim, (long long)k.block_size);
  }
  struct kernel *kernel = malloc(sizeof *kernel);
  if (kernel == NULL) return ort->CreateStatus(ORT_FAIL, "PagedAttention: out of memory");
  *kernel = k;
  *out = kernel;
  return NULL;
}

static void ORT_API_CALL destroy_kernel(void *kernel) { free(kernel); }

/* ---- Inputs -------------------------------------------------------------------------------- */

struct tensor {
  void *data;
  ONNXTensorElementDataType type;
  size_t rank;
  int64_t dims[4];
};

static const char *const INPUT_NAMES[N_IN] = {
    "q", "k", "v", "key_cache", "value_cache", "seq_lens", "query_start_loc", "block_tables",
    "slot_mapping"};

/* UNDEFINED: the caches are float32, fp8 or int8, the kernel's cache_type (checked per run). */
static const ONNXTensorElementDataType INPUT_TYPES[N_IN] = {
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,    ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32,    ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64};

static OrtStatus *read_input(OrtKernelContext *context, int index, size_t rank,
                             struct tensor *t) {
  const OrtValue *value;
  LLMC_TRY(ort->KernelContext_GetInput(context, index, &value));
  OrtTensorTypeAndShapeInfo *info;
  LLMC_TRY(ort->GetTensorTypeAndShape(value, &info));
  OrtStatus *status = ort->GetTensorElementType(info, &t->type);
  if (status == NULL) status = ort->GetDimensionsCount(info, &t->rank);
  if (status == NULL && t->rank != rank) {
    status = fail("PagedAttention: %s must have rank %zu, got %zu", INPUT_NAMES[index], rank,
                  t->rank);
  }
  if (status == NULL) status = ort->GetDimensions(info, t->dims, rank);
  ort->ReleaseTensorTypeAndShapeInfo(info);
  if (status == NULL) status = ort->GetTensorMutableData((OrtValue *)value, &t->data);
  return status;
}

/* ---- Parallel items on ORT's pool ---------------------------------------------------------- */

struct ort_items {
  OrtKernelContext *context;
  llmc_pa_item_fn fn;
  const void *ctx;
  int64_t num_items, next;
};

/* One ORT task per thread; each takes items from a shared counter until none are left, so the
 * kernel's dynamic schedule (costliest items first) holds whatever ORT's partitioning. */
static void ORT_API_CALL run_task(void *data, size_t task) {
  (void)task;
  struct ort_items *items = data;
  for (int64_t i; (i = __atomic_fetch_add(&items->next, 1, __ATOMIC_RELAXED)) < items->num_items;)
    items->fn(items->ctx, i);
}

static void run_on_ort(void *runner, llmc_pa_item_fn fn, const void *ctx, int64_t num_items) {
  struct ort_items items = {runner, fn, ctx, num_items, 0};
  long cpus = llmc_op_cpus();
  size_t tasks = (size_t)(cpus < num_items ? cpus : num_items);
  OrtStatus *status = ort->KernelContext_ParallelFor(items.context, run_task, tasks, 0, &items);
  if (status != NULL) { /* no pool: run every item here */
    ort->ReleaseStatus(status);
    run_task(&items, 0);
  } else if (items.next < num_items) {
    run_task(&items, 0); /* defensive: never leave an item undone */
  }
}

/* ---- Compute ------------------------------------------------------------------------------- */

static OrtStatus *ORT_API_CALL compute(void *kernel_state, OrtKernelContext *context) {
  const struct kernel *k = kernel_state;
  struct tensor in[N_IN];
  static const size_t ranks[N_IN] = {2, 2, 2, 4, 4, 1, 1, 2, 1};
  for (int i = 0; i < N_IN; ++i) {
    LLMC_TRY(read_input(context, i, ranks[i], &in[i]));
    ONNXTensorElementDataType want = INPUT_TYPES[i] != ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
                                         ? INPUT_TYPES[i]
                                         : k->cache_type;
    if (in[i].type != want) {
      return fail("PagedAttention: %s has ONNX element type %d, expected %d", INPUT_NAMES[i],
                  (int)in[i].type, (int)want);
    }
  }
  int64_t num_tokens = in[IN_Q].dims[0], num_seqs = in[IN_SEQ_LENS].dims[0];
  int64_t q_width = k->num_heads * k->head_dim, kv_width = k->num_kv_heads * k->head_dim;
  const int64_t *cache = in[IN_KEY_CACHE].dims;
  if (in[IN_Q].dims[1] != q_width || in[IN_K].dims[1] != kv_width ||
      in[IN_V].dims[1] != kv_width || in[IN_K].dims[0] != num_tokens ||
      in[IN_V].dims[0] != num_tokens || in[IN_SLOTS].dims[0] != num_tokens) {
    return fail("PagedAttention: q, k, v must be [T, %lld], [T, %lld], [T, %lld] with "
                "slot_mapping [T]", (long long)q_width, (long long)kv_width, (long long)kv_width);
  }
  if (cache[1] != k->block_size || cache[2] != k->num_kv_heads || cache[3] != k->head_dim ||
      memcmp(cache, in[IN_VALUE_CACHE].dims, sizeof in[IN_VALUE_CACHE].dims) != 0) {
    return fail("PagedAttention: key_cache and value_cache must both be [num_blocks, %lld, "
                "%lld, %lld]", (long long)k->block_size, (long long)k->num_kv_heads,
                (long long)k->head_dim);
  }
  if (in[IN_QSL].dims[0] != num_seqs + 1 || in[IN_BT].dims[0] != num_seqs) {
    return fail("PagedAttention: query_start_loc must be [B+1] and block_tables [B, max_blocks] "
                "for seq_lens [B]");
  }
  if (num_tokens > INT_MAX || num_seqs > INT_MAX || in[IN_BT].dims[1] > INT_MAX) {
    return fail("PagedAttention: too many tokens, sequences or blocks per sequence");
  }
  int64_t out_dims[2] = {num_tokens, q_width};
  OrtValue *out_value;
  LLMC_TRY(ort->KernelContext_GetOutput(context, 0, out_dims, 2, &out_value));
  void *out;
  LLMC_TRY(ort->GetTensorMutableData(out_value, &out));
  if (num_tokens == 0) return NULL;

  struct llmc_pa_parallel parallel = {run_on_ort, context};
  int status = llmc_paged_attention_on(
      &parallel, in[IN_Q].data, q_width, in[IN_K].data, kv_width, in[IN_V].data, kv_width,
      in[IN_KEY_CACHE].data, in[IN_VALUE_CACHE].data, cache[0], (int)k->block_size,
      in[IN_SEQ_LENS].data, in[IN_QSL].data, in[IN_BT].data, in[IN_BT].dims[1],
      (int)in[IN_BT].dims[1], in[IN_SLOTS].data, out, (int)num_tokens, (int)num_seqs,
      (int)k->num_heads, (int)k->num_kv_heads, (int)k->head_dim, k->scale,
      (int)k->sliding_window, k->softcap, k->cache_dtype, k->k_scale, k->v_scale,
      k->fpmath_mode);
  if (status != PA_OK) return fail("PagedAttention: %s", llmc_pa_status_message(status));
  return NULL;
}

/* ---- The op and its registration ----------------------------------------------------------- */

static struct llmc_op paged_attention_op = {
    .name = "PagedAttention",
    .num_inputs = N_IN,
    .num_outputs = 1,
    .input_types = INPUT_TYPES,
    .create = create_kernel,
    .compute = compute,
    .destroy = destroy_kernel,
};

OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
  ort = base->GetApi(ORT_API_VERSION);
  if (ort == NULL) return NULL; /* cannot even report: an ORT older than the header */
  /* Never released: ORT requires a domain to outlive every session created with it. */
  OrtCustomOpDomain *domain;
  LLMC_TRY(ort->CreateCustomOpDomain("llmc", &domain));
  LLMC_TRY(ort->CustomOpDomain_Add(domain, llmc_op_define(&paged_attention_op)));
  LLMC_TRY(ort->CustomOpDomain_Add(domain, llmc_block_int8_matmul_op(ort)));
  LLMC_TRY(ort->CustomOpDomain_Add(domain, llmc_rms_norm_op(ort)));
  LLMC_TRY(ort->CustomOpDomain_Add(domain, llmc_skip_rms_norm_op(ort)));
  LLMC_TRY(ort->CustomOpDomain_Add(domain, llmc_norm_skip_rms_norm_op(ort)));
  LLMC_TRY(ort->CustomOpDomain_Add(domain, llmc_qkv_rope_op(ort)));
  return ort->AddCustomOpDomain(options, domain);
}
