#pragma once
// A layer's Q, K and V rows made ready for attention on the GPU, as the model's family makes them
// (TransformerPass::prepare_qk, core/model/transformer_pass.cpp, over the CPU ops of
// kernels/cpu/ops.h): the Q/K/V biases added, each head of Q and of K RMS-normalised by its own
// weight, RoPE with angles the host computed (any RoPE variant: its base, linear scaling,
// frequency factors and attention factor are in the table, kernels::rope_table_scaled) on
// adjacent pairs or on the halves of each head, and the K and V heads stored into the fp16 paged
// pool. One launch per layer; the layered CUDA path of the families other than plain Llama
// (CudaOptions::families; not yet run on a GPU).
// `overlap`: the launch may start while the previous kernel of the stream finishes, and waits
// for it before reading anything (launch_overlap.cuh; compute capability 9.0 or later).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// Largest head_dim the kernel takes (a head lives in shared memory).
inline constexpr int kPrepareQkMaxHeadDim = 1024;

struct PrepareQkArgs {
  // (rows, row_stride) device f32: each row's n_head q heads, then n_kv_head k heads, then
  // n_kv_head v heads, head_dim each (the QKV product's row); rewritten in place.
  float* qkv = nullptr;
  int64_t rows = 0;
  int64_t row_stride = 0;
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  int rot_dim = 0;      // rotated dimensions of each q and k head (even, at most head_dim)
  bool halves = false;  // RoPE pairs (x[i], x[i + rot_dim/2]); false: (x[2i], x[2i+1])
  // ((n_head + 2·n_kv_head)·head_dim) device f32: bq, bk, bv back to back; null: no biases.
  const float* bias = nullptr;
  // (head_dim) device f32 each: the q heads' and the k heads' RMSNorm weights; null: no norm.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 0.0f;
  // (rows, rot_dim) device f32: row r's cos_i (rot_dim/2), then its sin_i (rot_dim/2), as
  // kernels::rope_table_scaled writes them for the row's position; null when rot_dim is 0.
  const float* rope = nullptr;
  // The K and V heads (after their bias, norm and RoPE) into the pool, rounded to nearest even
  // fp16, row r into slot kv_slots[r] (block · block_size + row within the block); the layout
  // (n_blocks, n_kv_head, block_size, head_dim) of the CPU's KvStorage. Null pools: no store.
  const int32_t* kv_slots = nullptr;
  int block_size = 0;
  uint16_t* k_pool = nullptr;
  uint16_t* v_pool = nullptr;
};

// Asynchronous on `stream`. Throws std::invalid_argument for a bad shape (head_dim outside
// 1..kPrepareQkMaxHeadDim, rot_dim odd or above head_dim, a row_stride shorter than the heads,
// rot_dim without a table, a store without slots or block size, more than 65535 heads a row),
// std::runtime_error if the launch fails.
void launch_prepare_qk(const PrepareQkArgs& args, cudaStream_t stream, bool overlap = false);

}  // namespace tokenfab::kernels
