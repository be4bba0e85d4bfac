/* The definition every llmc ONNX Runtime custom op shares (ort_custom_op.h): ORT's OrtCustomOp
 * callbacks, answered from struct llmc_op, and the helpers the ops' kernels call. */
#include "ort_custom_op.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static const struct llmc_op *llmc_op_of(const OrtCustomOp *op) {
  return (const struct llmc_op *)op; /* base is the first member */
}

static const char *ORT_API_CALL op_name(const OrtCustomOp *op) { return llmc_op_of(op)->name; }

static size_t ORT_API_CALL input_count(const OrtCustomOp *op) {
  return llmc_op_of(op)->num_inputs;
}

static size_t ORT_API_CALL output_count(const OrtCustomOp *op) {
  return llmc_op_of(op)->num_outputs;
}

static ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp *op, size_t index) {
  const struct llmc_op *o = llmc_op_of(op);
  if (o->input_types == NULL || index >= o->num_inputs) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  return o->input_types[index];
}

static const char *ORT_API_CALL cpu_provider(const OrtCustomOp *op) {
  (void)op;
  return "CPUExecutionProvider";
}

static OrtCustomOpInputOutputCharacteristic ORT_API_CALL required(const OrtCustomOp *op,
                                                                  size_t index) {
  (void)op;
  (void)index;
  return INPUT_OUTPUT_REQUIRED;
}

static OrtMemType ORT_API_CALL memory_type(const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return OrtMemTypeDefault;
}

static ONNXTensorElementDataType ORT_API_CALL float_output(const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

static int ORT_API_CALL one(const OrtCustomOp *op) {
  (void)op;
  return 1;
}

static int ORT_API_CALL last_version(const OrtCustomOp *op) {
  (void)op;
  return INT_MAX;
}

const OrtCustomOp *llmc_op_define(struct llmc_op *op) {
  if (op->base.version != 0) return &op->base;
  OrtCustomOp base = {0};
  base.version = ORT_API_VERSION;
  base.GetName = op_name;
  base.GetExecutionProviderType = cpu_provider;
  base.GetInputType = input_type;
  base.GetInputTypeCount = input_count;
  base.GetOutputType = float_output;
  base.GetOutputTypeCount = output_count;
  base.GetInputCharacteristic = required;
  base.GetOutputCharacteristic = required;
  base.GetInputMemoryType = memory_type;
  base.GetVariadicInputMinArity = one;
  base.GetVariadicInputHomogeneity = one;
  base.GetVariadicOutputMinArity = one;
  base.GetVariadicOutputHomogeneity = one;
  base.GetStartVersion = one;
  base.GetEndVersion = last_version;
  base.CreateKernelV2 = op->create;
  base.KernelComputeV2 = op->compute;
  base.KernelDestroy = op->destroy;
  op->base = base;
  return &op->base;
}

static long cpus_value = 1;
static pthread_once_t cpus_once = PTHREAD_ONCE_INIT;

static void count_cpus(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  cpus_value = cpus < 1 ? 1 : cpus;
}

long llmc_op_cpus(void) {
  pthread_once(&cpus_once, count_cpus);
  return cpus_value;
}

OrtStatus *llmc_op_fail(const OrtApi *api, const char *fmt, ...) {
  char message[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  return api->CreateStatus(ORT_INVALID_ARGUMENT, message);
}

void llmc_op_parallel_for(const OrtApi *api, OrtKernelContext *context,
                          void (*fn)(void *, size_t), size_t tasks, void *data) {
  if (tasks > 1) {
    OrtStatus *status = api->KernelContext_ParallelFor(context, fn, tasks, 0, data);
    if (status == NULL) return;
    api->ReleaseStatus(status); /* no pool: every task here */
  }
  for (size_t t = 0; t < tasks; ++t) fn(data, t);
}
