#pragma once
// Residual add on the GPU; mirrors kernels::add_inplace (kernels/cpu/ops.h), bit for bit.

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// y += x, element-wise. y, x: (n) device f32 (any row layout flattened).
// Asynchronous on `stream`; throws std::runtime_error if the launch fails.
void launch_add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);

}  // namespace tokenfab::kernels
