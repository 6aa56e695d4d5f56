#pragma once
// Device-side addressing of the paged fp16 KV pool shared by the kernels that read or write it
// (the attention kernels, the QKV GEMV's KV epilogue, RoPE's KV store): one layer's K (or V) is
// (n_blocks, n_kv_head, block_size, head_dim), the CPU KvStorage's layout. Include from .cu files
// only.

#include <cstdint>

namespace tokenfab::kernels::cuda_detail {

// The first element of kv head g's row at offset `within` of block `block`.
__device__ inline int64_t pool_row(int64_t block, int64_t within, int g, int n_kv_head,
                                   int block_size, int head_dim) {
  return ((block * n_kv_head + g) * block_size + within) * head_dim;
}

}  // namespace tokenfab::kernels::cuda_detail
