/* The RMS norm of one row (Zhang & Sennrich 2019), shared by llmc's ops that normalize:
 * y = x / sqrt(mean(x^2) + epsilon) * gamma, the sum of squares in float32 (16 lanes). */
#ifndef LLMC_RMS_NORM_ROW_H
#define LLMC_RMS_NORM_ROW_H

#include <math.h>
#include <stdint.h>

static inline void llmc_rms_norm_row(const float *restrict x, const float *restrict gamma,
                                     int64_t d, float epsilon, float *restrict y) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < d; ++i) sum += x[i] * x[i];
  float inverse = 1.0f / sqrtf(sum / (float)d + epsilon);
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) y[i] = x[i] * inverse * gamma[i];
}

#endif
