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

// Optionally, the rotated rows' K (and V) heads stored into the fp16 paged pool in the same
// launch, rounded to nearest even as the CPU stores them (kernels::fp32_to_fp16_row into the
// KvStorage layout, (n_blocks, n_kv_head, block_size, head_dim)): row r's k heads start at
// float k_offset of the row (after RoPE), its v heads at v_offset, into slot kv_slots[r].
struct RopeKvStore {
  int64_t k_offset = 0, v_offset = 0;  // floats into each row
  const int32_t* kv_slots = nullptr;   // (rows) device: block · block_size + row within the block
  int n_kv_head = 0, block_size = 0;
  uint16_t* k_pool = nullptr;  // one layer, (n_blocks, n_kv_head, block_size, head_dim) fp16 bits
  uint16_t* v_pool = nullptr;
};

// GGUF/llama convention: within each head, pairs (x[2i], x[2i+1]) for 2i < rot_dim are rotated by
// angle pos · base^(−2i/rot_dim); elements from rot_dim to head_dim are left as they are.
// x: `rows` rows of (n_heads, head_dim) device f32, row r starting at x + r·row_stride (so q and k
//    inside a fused qkv row can be rotated in place); positions: (rows) device int32.
// The angles are computed in double, as on the CPU, then rounded to f32. Asynchronous on
// `stream`. Throws std::invalid_argument for a bad shape (rot_dim odd, > head_dim or
// > kRopeMaxRotDim; row_stride < n_heads·head_dim; a store whose heads do not fit the rows),
// std::runtime_error if the launch fails.
void launch_rope(float* x, const int32_t* positions, int64_t rows, int64_t row_stride, int n_heads,
                 int head_dim, int rot_dim, float base, cudaStream_t stream, bool overlap = false,
                 const RopeKvStore* store = nullptr);

}  // namespace tokenfab::kernels
