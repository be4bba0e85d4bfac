/* llmc::RMSNorm, llmc::SkipRMSNorm and llmc::NormSkipRMSNorm as ONNX Runtime custom ops (ort_rms_norm.c), registered
 * beside llmc::PagedAttention by ort_op.c's RegisterCustomOps. */
#ifndef LLMC_ORT_RMS_NORM_H
#define LLMC_ORT_RMS_NORM_H

#include <onnxruntime_c_api.h>

/* The ops' definitions, filled on first call; api must outlive every session using them. */
const OrtCustomOp *llmc_rms_norm_op(const OrtApi *api);
const OrtCustomOp *llmc_skip_rms_norm_op(const OrtApi *api);
const OrtCustomOp *llmc_norm_skip_rms_norm_op(const OrtApi *api);

#endif
