#pragma once
// A draft head's residual block on the GPU (core/speculative/draft_head.h): a Medusa level's
// z = h + SiLU(W h + b), or an mtp step's z = h + SiLU(W [h; e] + b), each output row with its
// own W and b, so the levels of several requests' heads run in one launch.

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// For each output row j in [0, rows), with x_j = h_{src[j]} (Medusa, e null) or the
// concatenation [h_{src[j]}; e_j] (mtp): z_j = h_{src[j]} + SiLU(W_j x_j + b_j), where
// W_j = w[j], a (d, d) or (d, 2d) f32 matrix row-major out × in, and b_j = b[j], (d) f32;
// SiLU(u) = u / (1 + exp(-u)). w, b: device arrays (rows) of device pointers; h: (any, d) device
// f32; src: (rows) device int32, rows of h; e: null or (rows, d) device f32; z: (rows, d) device
// f32, not aliasing h or e. Each dot product is summed in f32 by one warp (lane-strided, then a
// butterfly). Asynchronous on `stream`; throws std::invalid_argument for a bad shape,
// std::runtime_error if the launch fails.
void launch_draft_residual(const float* const* w, const float* const* b, const float* h,
                           const int32_t* src, const float* e, float* z, int64_t rows, int64_t d,
                           cudaStream_t stream);

}  // namespace tokenfab::kernels
