/* What llmc's ONNX Runtime custom ops (paged_attention/ort_op.c, int8_matmul/ort_matmul.c,
 * rms_norm/ort_rms_norm.c, qkv_rope/ort_qkv_rope.c) share, defined in ort_custom_op.c: the op
 * definition (struct llmc_op: float32 outputs, every input and output required and in CPU
 * memory, the CPU EP, one version range from 1 up; each op gives its name, counts, input types
 * and kernel), errors, and running tasks on ORT's intra-op pool. */
#ifndef LLMC_ORT_CUSTOM_OP_H
#define LLMC_ORT_CUSTOM_OP_H

#include <stddef.h>

#include <onnxruntime_c_api.h>

#define LLMC_OP_INTERNAL __attribute__((visibility("hidden")))

/* One op. Why base first: ORT calls each callback with the OrtCustomOp it was given, and the
 * shared callbacks cast it back to read the rest (the pattern of ORT's own C++
 * Ort::CustomOpBase). */
struct llmc_op {
  OrtCustomOp base; /* filled by llmc_op_define */
  const char *name;
  size_t num_inputs, num_outputs;
  /* [num_inputs] ONNX element types (UNDEFINED: any, the kernel checks); NULL: all float32 */
  const ONNXTensorElementDataType *input_types;
  OrtStatus *(ORT_API_CALL *create)(const OrtCustomOp *op, const OrtApi *api,
                                    const OrtKernelInfo *info, void **kernel);
  OrtStatus *(ORT_API_CALL *compute)(void *kernel, OrtKernelContext *context);
  void(ORT_API_CALL *destroy)(void *kernel);
};

/* op->base for ORT, filled on the first call from op's other fields. */
LLMC_OP_INTERNAL const OrtCustomOp *llmc_op_define(struct llmc_op *op);

/* The online cores, asked once per library: glibc's sysconf(_SC_NPROCESSORS_ONLN) reads /sys
 * on every call (~3 us here), and the ops size their task counts on every run. */
LLMC_OP_INTERNAL long llmc_op_cpus(void);

/* An ORT_INVALID_ARGUMENT status with a printf-style message (a bad input or attribute). */
LLMC_OP_INTERNAL OrtStatus *llmc_op_fail(const OrtApi *api, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Return the status of an ORT API call from the calling function unless it succeeded. */
#define LLMC_TRY(call)                   \
  do {                                   \
    OrtStatus *status_ = (call);         \
    if (status_ != NULL) return status_; \
  } while (0)

/* fn(data, t) for every t < tasks: on ORT's intra-op pool, or on the calling thread when the
 * context has none (or for a single task, which needs no pool). */
LLMC_OP_INTERNAL void llmc_op_parallel_for(const OrtApi *api, OrtKernelContext *context,
                                           void (*fn)(void *, size_t), size_t tasks, void *data);

#endif
