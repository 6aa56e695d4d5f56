#pragma once
// A Medusa draft head's residual block on the GPU (core/speculative/draft_head.h):
// z = h + SiLU(W h + b), each output row with its own head level's W and b, so the levels of
// several requests' heads run in one launch.

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// For each output row j in [0, rows): z_j = h_{src[j]} + SiLU(W_j h_{src[j]} + b_j), where
// W_j = w[j], a (d, d) f32 matrix row-major out × in, and b_j = b[j], (d) f32; SiLU(u) =
// u / (1 + exp(-u)). w, b: device arrays (rows) of device pointers; h: (any, d) device f32;
// src: (rows) device int32, rows of h; z: (rows, d) device f32, not aliasing h. Each dot product
// is summed in f32 by one warp (lane-strided, then a butterfly). Asynchronous on `stream`;
// throws std::invalid_argument for a bad shape, std::runtime_error if the launch fails.
void launch_medusa_residual(const float* const* w, const float* const* b, const float* h,
                            const int32_t* src, float* z, int64_t rows, int64_t d,
                            cudaStream_t stream);

}  // namespace tokenfab::kernels
