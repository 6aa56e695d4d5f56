#pragma once
// Residual add on the GPU; mirrors kernels::add_inplace (kernels/cpu/ops.h), bit for bit.
// `overlap`: the launch may start while the previous kernel of the stream finishes, and waits
// for it before reading anything (launch_overlap.cuh; compute capability 9.0 or later).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// y += x, element-wise. y, x: (n) device f32 (any row layout flattened).
// Asynchronous on `stream`; throws std::runtime_error if the launch fails.
void launch_add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream,
                        bool overlap = false);

}  // namespace tokenfab::kernels
