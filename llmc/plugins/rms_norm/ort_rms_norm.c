/* llmc::RMSNorm and llmc::SkipRMSNorm as ONNX Runtime custom ops: the root-mean-square norm of
 * Zhang & Sennrich 2019 ("Root Mean Square Layer Normalization") over the last axis,
 *
 *   y = x / sqrt(mean(x^2) + epsilon) * gamma
 *
 * and, for SkipRMSNorm, of the sum of two inputs (a decoder layer's residual stream plus a
 * sublayer's output), which it also returns:
 *
 *   h = a + b;  y = h / sqrt(mean(h^2) + epsilon) * gamma
 *
 * RMSNorm: inputs X float32 [..., D] and gamma float32 [D]; output Y [..., D].
 * SkipRMSNorm: inputs A, B float32 [..., D] (the same shape) and gamma [D]; outputs Y and H.
 * Attribute epsilon (float, default 1e-5). gamma must be a constant initializer of D elements;
 * a mismatched shape fails the run with ORT_INVALID_ARGUMENT (the session goes on).
 *
 * Why ours: ONNX Runtime 1.31's kernels for these (SimplifiedLayerNormalization,
 * com.microsoft.SkipSimplifiedLayerNormalization) take 24 and 103 us for [128, 640] on a 2-core
 * host (benchmarks/RESULTS.md), a 10th of a Gemma 3 270M prefill; each row here is two
 * vectorized passes over data in L1 (the sum of squares in float32, 16 lanes, then the scaled
 * write), rows split over ORT's intra-op pool when there are enough of them.
 */
#include "ort_rms_norm.h"

#include <stdlib.h>
#include <string.h>

#include "ort_custom_op.h"
#include "rms_norm_row.h"

static const OrtApi *ort;

/* Rows per task of the pool: fewer rows than this per thread run on the calling thread (waking
 * the pool costs more than normalizing a few rows of a few thousand floats). */
#define ROWS_PER_TASK 16

struct kernel {
  const float *gamma;
  int64_t d;
  float epsilon;
  int skip; /* 1: SkipRMSNorm */
};

#define fail(...) llmc_op_fail(ort, __VA_ARGS__)


/* ---- Rows ---------------------------------------------------------------------------------- */

struct job {
  const struct kernel *kernel;
  const float *a, *b;
  float *y, *h;
  int64_t rows, tasks;
};

static void rows_task(void *data, size_t task) {
  const struct job *j = data;
  const struct kernel *k = j->kernel;
  int64_t r0 = j->rows * (int64_t)task / j->tasks, r1 = j->rows * ((int64_t)task + 1) / j->tasks;
  for (int64_t r = r0; r < r1; ++r) {
    const float *x = j->a + r * k->d;
    if (k->skip) {
      const float *restrict a = x, *restrict b = j->b + r * k->d;
      float *restrict h = j->h + r * k->d;
#pragma omp simd
      for (int64_t i = 0; i < k->d; ++i) h[i] = a[i] + b[i];
      x = h;
    }
    llmc_rms_norm_row(x, k->gamma, k->d, k->epsilon, j->y + r * k->d);
  }
}

/* ---- Kernel -------------------------------------------------------------------------------- */

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api,
                                             const OrtKernelInfo *info, void **out) {
  (void)api;
  int skip = op->GetInputTypeCount(op) == 3;
  const char *name = skip ? "SkipRMSNorm" : "RMSNorm";
  float epsilon = 1e-5f;
  OrtStatus *status = ort->KernelInfoGetAttribute_float(info, "epsilon", &epsilon);
  if (status != NULL) ort->ReleaseStatus(status); /* optional */
  if (!(epsilon >= 0.0f)) return fail("%s: epsilon must be >= 0, got %g", name, epsilon);
  int is_constant = 0;
  const OrtValue *value = NULL;
  LLMC_TRY(ort->KernelInfoGetConstantInput_tensor(info, skip ? 2 : 1, &is_constant, &value));
  if (!is_constant || value == NULL) return fail("%s: gamma must be a constant initializer", name);
  OrtTensorTypeAndShapeInfo *shape;
  LLMC_TRY(ort->GetTensorTypeAndShape(value, &shape));
  size_t rank = 0, elements = 0;
  status = ort->GetDimensionsCount(shape, &rank);
  if (status == NULL) status = ort->GetTensorShapeElementCount(shape, &elements);
  ort->ReleaseTensorTypeAndShapeInfo(shape);
  if (status != NULL) return status;
  if (rank != 1 || elements < 1) return fail("%s: gamma must be a non-empty vector", name);
  struct kernel *kernel = malloc(sizeof *kernel);
  if (kernel == NULL) return ort->CreateStatus(ORT_FAIL, "RMSNorm: out of memory");
  LLMC_TRY(ort->GetTensorMutableData((OrtValue *)value, (void **)&kernel->gamma));
  kernel->d = (int64_t)elements;
  kernel->epsilon = epsilon;
  kernel->skip = skip;
  *out = kernel;
  return NULL;
}

static void ORT_API_CALL destroy_kernel(void *state) { free(state); }

/* The shape of input `index` into dims (rank <= 8); fails unless its last axis is d. */
static OrtStatus *input_shape(OrtKernelContext *context, const struct kernel *k, size_t index,
                              const OrtValue **value, int64_t *dims, size_t *rank) {
  const char *name = k->skip ? "SkipRMSNorm" : "RMSNorm";
  LLMC_TRY(ort->KernelContext_GetInput(context, index, value));
  OrtTensorTypeAndShapeInfo *info;
  LLMC_TRY(ort->GetTensorTypeAndShape(*value, &info));
  OrtStatus *status = ort->GetDimensionsCount(info, rank);
  if (status == NULL && (*rank < 1 || *rank > 8))
    status = fail("%s: inputs must have rank 1 to 8, got %zu", name, *rank);
  if (status == NULL) status = ort->GetDimensions(info, dims, *rank);
  ort->ReleaseTensorTypeAndShapeInfo(info);
  if (status != NULL) return status;
  if (dims[*rank - 1] != k->d)
    return fail("%s: the last axis must be %lld (gamma's length), got %lld", name,
                (long long)k->d, (long long)dims[*rank - 1]);
  return NULL;
}

static OrtStatus *ORT_API_CALL compute(void *kernel_state, OrtKernelContext *context) {
  const struct kernel *k = kernel_state;
  const OrtValue *a_value, *b_value = NULL;
  int64_t dims[8], b_dims[8];
  size_t rank = 0, b_rank = 0;
  LLMC_TRY(input_shape(context, k, 0, &a_value, dims, &rank));
  if (k->skip) {
    LLMC_TRY(input_shape(context, k, 1, &b_value, b_dims, &b_rank));
    if (b_rank != rank || memcmp(dims, b_dims, rank * sizeof *dims) != 0)
      return fail("SkipRMSNorm: A and B must have the same shape");
  }
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < rank; ++i) rows *= dims[i];
  struct job job = {k, NULL, NULL, NULL, NULL, rows, 1};
  OrtValue *y_value, *h_value;
  LLMC_TRY(ort->KernelContext_GetOutput(context, 0, dims, rank, &y_value));
  LLMC_TRY(ort->GetTensorMutableData(y_value, (void **)&job.y));
  LLMC_TRY(ort->GetTensorMutableData((OrtValue *)a_value, (void **)&job.a));
  if (k->skip) {
    LLMC_TRY(ort->KernelContext_GetOutput(context, 1, dims, rank, &h_value));
    LLMC_TRY(ort->GetTensorMutableData(h_value, (void **)&job.h));
    LLMC_TRY(ort->GetTensorMutableData((OrtValue *)b_value, (void **)&job.b));
  }
  if (rows == 0) return NULL;
  int64_t tasks = rows / ROWS_PER_TASK, cpus = llmc_op_cpus();
  job.tasks = tasks < 1 ? 1 : tasks > cpus ? cpus : tasks;
  llmc_op_parallel_for(ort, context, rows_task, (size_t)job.tasks, &job);
  return NULL;
}

/* ---- The ops ------------------------------------------------------------------------------- */

static const char *ORT_API_CALL rms_norm_name(const OrtCustomOp *op) {
  (void)op;
  return "RMSNorm";
}

static const char *ORT_API_CALL skip_rms_norm_name(const OrtCustomOp *op) {
  (void)op;
  return "SkipRMSNorm";
}

static ONNXTensorElementDataType ORT_API_CALL float_type(const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

static size_t ORT_API_CALL two(const OrtCustomOp *op) {
  (void)op;
  return 2;
}

static size_t ORT_API_CALL three(const OrtCustomOp *op) {
  (void)op;
  return 3;
}

static OrtCustomOp rms_norm_op, skip_rms_norm_op;

static void define(OrtCustomOp *op, int skip) {
  OrtCustomOp def = {0};
  llmc_op_defaults(&def);
  def.GetName = skip ? skip_rms_norm_name : rms_norm_name;
  def.GetInputType = float_type;
  def.GetInputTypeCount = skip ? three : two;
  if (skip) def.GetOutputTypeCount = two;
  def.KernelDestroy = destroy_kernel;
  def.CreateKernelV2 = create_kernel;
  def.KernelComputeV2 = compute;
  *op = def;
}

const OrtCustomOp *llmc_rms_norm_op(const OrtApi *api) {
  ort = api;
  if (rms_norm_op.version == 0) define(&rms_norm_op, 0);
  return &rms_norm_op;
}

const OrtCustomOp *llmc_skip_rms_norm_op(const OrtApi *api) {
  ort = api;
  if (skip_rms_norm_op.version == 0) define(&skip_rms_norm_op, 1);
  return &skip_rms_norm_op;
}
