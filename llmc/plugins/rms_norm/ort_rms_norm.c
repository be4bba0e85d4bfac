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
 * and, for NormSkipRMSNorm, of the residual stream plus the sublayer's output normalized first
 * (Gemma's post-attention / post-feedforward norm, the residual add and the next pre-norm):
 *
 *   h = a + b / sqrt(mean(b^2) + epsilon_b) * gamma_b;  y = h / sqrt(mean(h^2) + epsilon) * gamma
 *
 * RMSNorm: inputs X float32 [..., D] and gamma float32 [D]; output Y [..., D].
 * SkipRMSNorm: inputs A, B float32 [..., D] (the same shape) and gamma [D]; outputs Y and H.
 * NormSkipRMSNorm: inputs A, B [..., D], gamma_b [D], gamma [D]; outputs Y and H; attribute
 * epsilon_b (float, default 1e-5). The normalized B is rounded to float32 before the add, so H
 * equals RMSNorm then SkipRMSNorm bit for bit.
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
  const float *gamma, *gamma_b; /* gamma_b: NormSkipRMSNorm's, else NULL */
  int64_t d;
  float epsilon, epsilon_b;
  int skip; /* 1: SkipRMSNorm or NormSkipRMSNorm */
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
      if (k->gamma_b != NULL) { /* the normalized row stored first: no fused multiply-add */
        llmc_rms_norm_row(b, k->gamma_b, k->d, k->epsilon_b, h);
#pragma omp simd
        for (int64_t i = 0; i < k->d; ++i) h[i] += a[i];
      } else {
#pragma omp simd
        for (int64_t i = 0; i < k->d; ++i) h[i] = a[i] + b[i];
      }
      x = h;
    }
    llmc_rms_norm_row(x, k->gamma, k->d, k->epsilon, j->y + r * k->d);
  }
}

/* ---- Kernel -------------------------------------------------------------------------------- */

static const char *op_name(size_t inputs) {
  return inputs == 4 ? "NormSkipRMSNorm" : inputs == 3 ? "SkipRMSNorm" : "RMSNorm";
}

/* An optional float attribute >= 0 (default 1e-5). */
static OrtStatus *get_epsilon(const OrtKernelInfo *info, const char *name, const char *attribute,
                              float *out) {
  *out = 1e-5f;
  OrtStatus *status = ort->KernelInfoGetAttribute_float(info, attribute, out);
  if (status != NULL) ort->ReleaseStatus(status); /* optional */
  if (!(*out >= 0.0f)) return fail("%s: %s must be >= 0, got %g", name, attribute, *out);
  return NULL;
}

/* Constant input `index`: a float32 vector of *d elements (*d 0: any length, set here). */
static OrtStatus *get_gamma(const OrtKernelInfo *info, const char *name, size_t index,
                            const float **gamma, int64_t *d) {
  int is_constant = 0;
  const OrtValue *value = NULL;
  LLMC_TRY(ort->KernelInfoGetConstantInput_tensor(info, index, &is_constant, &value));
  if (!is_constant || value == NULL) return fail("%s: gamma must be a constant initializer", name);
  OrtTensorTypeAndShapeInfo *shape;
  LLMC_TRY(ort->GetTensorTypeAndShape(value, &shape));
  size_t rank = 0, elements = 0;
  OrtStatus *status = ort->GetDimensionsCount(shape, &rank);
  if (status == NULL) status = ort->GetTensorShapeElementCount(shape, &elements);
  ort->ReleaseTensorTypeAndShapeInfo(shape);
  if (status != NULL) return status;
  if (rank != 1 || elements < 1) return fail("%s: gamma must be a non-empty vector", name);
  if (*d != 0 && (int64_t)elements != *d)
    return fail("%s: gamma_b and gamma must have one length, got %lld and %zu", name,
                (long long)*d, elements);
  *d = (int64_t)elements;
  return ort->GetTensorMutableData((OrtValue *)value, (void **)gamma);
}

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api,
                                             const OrtKernelInfo *info, void **out) {
  (void)api;
  size_t inputs = op->GetInputTypeCount(op);
  const char *name = op_name(inputs);
  struct kernel k = {NULL, NULL, 0, 0.0f, 0.0f, inputs >= 3};
  LLMC_TRY(get_epsilon(info, name, "epsilon", &k.epsilon));
  if (inputs == 4) {
    LLMC_TRY(get_epsilon(info, name, "epsilon_b", &k.epsilon_b));
    LLMC_TRY(get_gamma(info, name, 2, &k.gamma_b, &k.d));
  }
  LLMC_TRY(get_gamma(info, name, inputs - 1, &k.gamma, &k.d));
  struct kernel *kernel = malloc(sizeof *kernel);
  if (kernel == NULL) return ort->CreateStatus(ORT_FAIL, "RMSNorm: out of memory");
  *kernel = k;
  *out = kernel;
  return NULL;
}

static void ORT_API_CALL destroy_kernel(void *state) { free(state); }

/* The shape of input `index` into dims (rank <= 8); fails unless its last axis is d. */
static OrtStatus *input_shape(OrtKernelContext *context, const struct kernel *k, size_t index,
                              const OrtValue **value, int64_t *dims, size_t *rank) {
  const char *name = k->gamma_b != NULL ? "NormSkipRMSNorm" : k->skip ? "SkipRMSNorm" : "RMSNorm";
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
      return fail("%s: A and B must have the same shape",
                  k->gamma_b != NULL ? "NormSkipRMSNorm" : "SkipRMSNorm");
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

/* One kernel for the three: create_kernel tells them apart by their input count. */
static struct llmc_op rms_norm_op = {
    .name = "RMSNorm",
    .num_inputs = 2,
    .num_outputs = 1,
    .create = create_kernel,
    .compute = compute,
    .destroy = destroy_kernel,
};

static struct llmc_op skip_rms_norm_op = {
    .name = "SkipRMSNorm",
    .num_inputs = 3,
    .num_outputs = 2,
    .create = create_kernel,
    .compute = compute,
    .destroy = destroy_kernel,
};

static struct llmc_op norm_skip_rms_norm_op = {
    .name = "NormSkipRMSNorm",
    .num_inputs = 4,
    .num_outputs = 2,
    .create = create_kernel,
    .compute = compute,
    .destroy = destroy_kernel,
};

const OrtCustomOp *llmc_rms_norm_op(const OrtApi *api) {
  ort = api;
  return llmc_op_define(&rms_norm_op);
}

const OrtCustomOp *llmc_skip_rms_norm_op(const OrtApi *api) {
  ort = api;
  return llmc_op_define(&skip_rms_norm_op);
}

const OrtCustomOp *llmc_norm_skip_rms_norm_op(const OrtApi *api) {
  ort = api;
  return llmc_op_define(&norm_skip_rms_norm_op);
}
