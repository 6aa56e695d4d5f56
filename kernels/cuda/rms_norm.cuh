#pragma once
// RMS normalisation on the GPU; mirrors kernels::rms_norm (kernels/cpu/ops.h) row by row.
// `overlap`: the launch may start while the previous kernel of the stream finishes, and waits
// for it before reading anything (launch_overlap.cuh; compute capability 9.0 or later).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// y[r] = x[r] / sqrt(mean(x[r]²) + eps) * w for each of `rows` rows of n elements.
// x, y: (rows, n) device f32, y may equal x; w: (n) device f32. Asynchronous on `stream`;
// throws std::runtime_error if the launch fails.
void launch_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
                     cudaStream_t stream, bool overlap = false);

// The same, written as bf16 bits: exactly launch_rms_norm followed by launch_f32_to_bf16 (one
// kernel instead of two; a GEMM's input).
void launch_rms_norm_bf16(const float* x, const float* w, uint16_t* y, int64_t rows, int64_t n,
                          float eps, cudaStream_t stream, bool overlap = false);

}  // namespace tokenfab::kernels
