/* llmc::QKVRoPE as an ONNX Runtime custom op (ort_qkv_rope.c), registered beside
 * llmc::PagedAttention by ort_op.c's RegisterCustomOps. */
#ifndef LLMC_ORT_QKV_ROPE_H
#define LLMC_ORT_QKV_ROPE_H

#include <onnxruntime_c_api.h>

/* The op's definition, filled on first call; api must outlive every session using it. */
const OrtCustomOp *llmc_qkv_rope_op(const OrtApi *api);

#endif
