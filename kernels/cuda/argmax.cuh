#pragma once
// Greedy sampling on the GPU: the argmax of each row; mirrors kernels::argmax (kernels/cpu/ops.h).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// out[r] = index of the largest value of row r, the lowest one among equal maxima; NaNs are
// skipped (0 when every value of the row is NaN or n == 0).
// x: (rows, n) device f32; out: (rows) device int32 (n must fit in int32: a vocabulary).
// Asynchronous on `stream`. Throws std::invalid_argument for a bad shape, std::runtime_error if
// the launch fails.
void launch_argmax_rows(const float* x, int32_t* out, int64_t rows, int64_t n, cudaStream_t stream);

}  // namespace tokenfab::kernels
