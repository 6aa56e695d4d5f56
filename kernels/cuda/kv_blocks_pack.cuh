#pragma once
// KV blocks of one layer gathered into one contiguous buffer and scattered back, so a sequence's
// blocks cross to another GPU (or pinned host memory) in one copy per layer.

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// k, v: one layer's pool, fp16 bits, layout (n_blocks, n_kv_head, block_size, head_dim) each, so
//       one block of one of them is block_halves = n_kv_head·block_size·head_dim contiguous halves.
// block_ids: (n_ids) device int32, the blocks to move, in packed order.
// packed: (n_ids, 2, block_halves) device fp16 bits: listed block i's K block, then its V block
//         (a prefix of the list is a prefix of the buffer).
// Asynchronous on `stream`. Throws std::invalid_argument for a negative shape,
// std::runtime_error if the launch fails. Block ids are not range-checked on the device.
void launch_kv_pack_blocks(const uint16_t* k, const uint16_t* v, const int32_t* block_ids,
                           int64_t n_ids, int64_t block_halves, uint16_t* packed,
                           cudaStream_t stream);

// The inverse: packed's blocks written back to blocks block_ids of k and v (each id once).
void launch_kv_unpack_blocks(const uint16_t* packed, const int32_t* block_ids, int64_t n_ids,
                             int64_t block_halves, uint16_t* k, uint16_t* v, cudaStream_t stream);

}  // namespace tokenfab::kernels
