/* What llmc's ONNX Runtime custom ops (paged_attention/ort_op.c, int8_matmul/ort_matmul.c,
 * rms_norm/ort_rms_norm.c, qkv_rope/ort_qkv_rope.c) share: float32 outputs (one unless the op
 * sets its count), every input and output required and in CPU memory, the CPU EP, one version
 * range from 1 up. llmc_op_defaults fills those fields of an OrtCustomOp; each op adds its
 * name, types, counts and kernel. */
#ifndef LLMC_ORT_CUSTOM_OP_H
#define LLMC_ORT_CUSTOM_OP_H

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include <onnxruntime_c_api.h>

/* The online cores, asked once per library: glibc's sysconf(_SC_NPROCESSORS_ONLN) reads /sys
 * on every call (~3 us here), and the ops size their task counts on every run. */
static long llmc_op_cpus_value = 1;
static pthread_once_t llmc_op_cpus_once = PTHREAD_ONCE_INIT;

static void llmc_op_count_cpus(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  llmc_op_cpus_value = cpus < 1 ? 1 : cpus;
}

static inline long llmc_op_cpus(void) {
  pthread_once(&llmc_op_cpus_once, llmc_op_count_cpus);
  return llmc_op_cpus_value;
}

static const char *ORT_API_CALL llmc_op_cpu_provider(const OrtCustomOp *op) {
  (void)op;
  return "CPUExecutionProvider";
}

static OrtCustomOpInputOutputCharacteristic ORT_API_CALL llmc_op_required(const OrtCustomOp *op,
                                                                          size_t index) {
  (void)op;
  (void)index;
  return INPUT_OUTPUT_REQUIRED;
}

static OrtMemType ORT_API_CALL llmc_op_memory_type(const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return OrtMemTypeDefault;
}

static ONNXTensorElementDataType ORT_API_CALL llmc_op_float_output(const OrtCustomOp *op,
                                                                  size_t index) {
  (void)op;
  (void)index;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

static size_t ORT_API_CALL llmc_op_one_output(const OrtCustomOp *op) {
  (void)op;
  return 1;
}

static int ORT_API_CALL llmc_op_one(const OrtCustomOp *op) {
  (void)op;
  return 1;
}

static int ORT_API_CALL llmc_op_last_version(const OrtCustomOp *op) {
  (void)op;
  return INT_MAX;
}

/* An ORT_INVALID_ARGUMENT status with a printf-style message (a bad input or attribute). */
static inline OrtStatus *llmc_op_fail(const OrtApi *api, const char *fmt, ...) {
  char message[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  return api->CreateStatus(ORT_INVALID_ARGUMENT, message);
}

/* Return the status of an ORT API call from the calling function unless it succeeded. */
#define LLMC_TRY(call)                   \
  do {                                   \
    OrtStatus *status_ = (call);         \
    if (status_ != NULL) return status_; \
  } while (0)

/* fn(data, t) for every t < tasks: on ORT's intra-op pool, or on the calling thread when the
 * context has none (or for a single task, which needs no pool). */
static inline void llmc_op_parallel_for(const OrtApi *api, OrtKernelContext *context,
                                        void (*fn)(void *, size_t), size_t tasks, void *data) {
  if (tasks > 1) {
    OrtStatus *status = api->KernelContext_ParallelFor(context, fn, tasks, 0, data);
    if (status == NULL) return;
    api->ReleaseStatus(status); /* no pool: every task here */
  }
  for (size_t t = 0; t < tasks; ++t) fn(data, t);
}

static inline void llmc_op_defaults(OrtCustomOp *op) {
  op->version = ORT_API_VERSION;
  op->GetExecutionProviderType = llmc_op_cpu_provider;
  op->GetOutputType = llmc_op_float_output;
  op->GetOutputTypeCount = llmc_op_one_output;
  op->GetInputCharacteristic = llmc_op_required;
  op->GetOutputCharacteristic = llmc_op_required;
  op->GetInputMemoryType = llmc_op_memory_type;
  op->GetVariadicInputMinArity = llmc_op_one;
  op->GetVariadicInputHomogeneity = llmc_op_one;
  op->GetVariadicOutputMinArity = llmc_op_one;
  op->GetVariadicOutputHomogeneity = llmc_op_one;
  op->GetStartVersion = llmc_op_one;
  op->GetEndVersion = llmc_op_last_version;
}

#endif
