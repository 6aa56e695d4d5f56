#pragma once
// A pass's K and V rows written into the fp16 paged KV pool on the GPU; mirrors the CPU runner's
// store (core/runtime/model_runner.cpp: kernels::fp32_to_fp16_row into KvStorage::offset), bit for
// bit for finite values (a NaN becomes CUDA's canonical half NaN). The many-row steps' store
// after RoPE where CudaOptions::fused_epilogues is off (the kernel of the last GPU run,
// 2026-12-04); with it on, RoPE's launch stores the rows itself (rope.cuh's RopeKvStore, the same
// values in the same slots).
// `overlap`: the launch may start while the previous kernel of the stream finishes, and waits
// for it before reading anything (launch_overlap.cuh; compute capability 9.0 or later).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// k, v: (n_rows) rows of (n_kv_head, head_dim) device f32, row r at k + r·row_stride (so they may
//       sit inside a fused qkv row). slots: (n_rows) device int32, slot = block · block_size +
//       row within the block, where row r goes. k_pool, v_pool: one layer's pool, fp16 bits,
//       layout (n_blocks, n_kv_head, block_size, head_dim). Rounding to nearest even.
// Slots are not range-checked on the device (the runner validated the block tables).
// Asynchronous on `stream`. Throws std::invalid_argument for a bad shape, std::runtime_error if
// the launch fails.
void launch_kv_store_rows(const float* k, const float* v, int64_t row_stride, const int32_t* slots,
                          int64_t n_rows, int n_kv_head, int head_dim, int block_size,
                          uint16_t* k_pool, uint16_t* v_pool, cudaStream_t stream,
                          bool overlap = false);

}  // namespace tokenfab::kernels
