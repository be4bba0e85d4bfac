/* llmc::BlockInt8MatMul as an ONNX Runtime custom op (ort_matmul.c), registered beside
 * llmc::PagedAttention by ort_op.c's RegisterCustomOps. */
#ifndef LLMC_ORT_MATMUL_H
#define LLMC_ORT_MATMUL_H

#include <onnxruntime_c_api.h>

/* The op's definition, filled on first call; api must outlive every session using it. */
const OrtCustomOp *llmc_block_int8_matmul_op(const OrtApi *api);

#endif
