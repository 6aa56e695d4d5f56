#pragma once
// Rotary position embedding on the GPU; mirrors kernels::rope_table + kernels::rope
// (kernels/cpu/ops.h) row by row, each row at its own position.
// `overlap`: the launch may start while the previous kernel of the stream finishes: it builds its
// angles from the (uploaded) positions, then waits for that kernel before it reads x
// (launch_overlap.cuh; compute capability 9.0 or later).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// Largest rot_dim the kernel takes (its per-row cos/sin table lives in shared memory).
inline constexpr int kRopeMaxRotDim = 1024;

// GGUF/llama convention: within each head, pairs (x[2i], x[2i+1]) for 2i < rot_dim are rotated by
// angle pos · base^(−2i/rot_dim); elements from rot_dim to head_dim are left as they are.
// x: `rows` rows of (n_heads, head_dim) device f32, row r starting at x + r·row_stride (so q and k
//    inside a fused qkv row can be rotated in place); positions: (rows) device int32.
// The angles are computed in double, as on the CPU, then rounded to f32. Asynchronous on
// `stream`. Throws std::invalid_argument for a bad shape (rot_dim odd, > head_dim or
// > kRopeMaxRotDim; row_stride < n_heads·head_dim), std::runtime_error if the launch fails.
void launch_rope(float* x, const int32_t* positions, int64_t rows, int64_t row_stride, int n_heads,
                 int head_dim, int rot_dim, float base, cudaStream_t stream, bool overlap = false);

}  // namespace tokenfab::kernels
