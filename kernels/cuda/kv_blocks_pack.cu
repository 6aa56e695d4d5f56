#include "kernels/cuda/kv_blocks_pack.cuh"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridX = 1024;  // the word loop strides by the grid beyond this
constexpr int64_t kMaxGridY = 65535;

// Word: uint4 (8 halves, 16-byte copies) when sizes and pointers allow, else uint16_t.
// Grid (x: word chunks, y: packed slot = listed block · 2 + (0: K, 1: V)).
// pool_k, pool_v: (n_blocks, block_words); packed: (n_ids, 2, block_words).
template <typename Word, bool kPack>
__global__ void kv_blocks_copy_kernel(Word* pool_k, Word* pool_v, const int32_t* block_ids,
                                      int64_t n_ids, int64_t block_words, Word* packed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t slot = blockIdx.y; slot < 2 * n_ids; slot += gridDim.y) {
    Word* pool =
        (slot % 2 == 0 ? pool_k : pool_v) + static_cast<int64_t>(block_ids[slot / 2]) * block_words;
    Word* buffer = packed + slot * block_words;
    for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < block_words;
         w += stride) {
      if constexpr (kPack) {
        buffer[w] = pool[w];
      } else {
        pool[w] = buffer[w];
      }
    }
  }
}

template <typename Word, bool kPack>
void launch_copy(uint16_t* k, uint16_t* v, const int32_t* block_ids, int64_t n_ids,
                 int64_t block_halves, uint16_t* packed, cudaStream_t stream) {
  const int64_t block_words =
      block_halves * static_cast<int64_t>(sizeof(uint16_t)) / static_cast<int64_t>(sizeof(Word));
  const dim3 grid(
      static_cast<unsigned>(std::min((block_words + kThreads - 1) / kThreads, kMaxGridX)),
      static_cast<unsigned>(std::min(2 * n_ids, kMaxGridY)));
  kv_blocks_copy_kernel<Word, kPack><<<grid, kThreads, 0, stream>>>(
      reinterpret_cast<Word*>(k), reinterpret_cast<Word*>(v), block_ids, n_ids, block_words,
      reinterpret_cast<Word*>(packed));
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <bool kPack>
void copy_blocks(uint16_t* k, uint16_t* v, const int32_t* block_ids, int64_t n_ids,
                 int64_t block_halves, uint16_t* packed, cudaStream_t stream, const char* what) {
  if (n_ids < 0 || block_halves < 0)
    throw std::invalid_argument(std::string(what) + ": negative shape (" + std::to_string(n_ids) +
                                ", " + std::to_string(block_halves) + ")");
  if (n_ids == 0 || block_halves == 0) return;
  if (block_halves % 8 == 0 && aligned16(k) && aligned16(v) && aligned16(packed)) {
    launch_copy<uint4, kPack>(k, v, block_ids, n_ids, block_halves, packed, stream);
  } else {
    launch_copy<uint16_t, kPack>(k, v, block_ids, n_ids, block_halves, packed, stream);
  }
}

}  // namespace

void launch_kv_pack_blocks(const uint16_t* k, const uint16_t* v, const int32_t* block_ids,
                           int64_t n_ids, int64_t block_halves, uint16_t* packed,
                           cudaStream_t stream) {
  // The kernel is shared with unpack, which writes the pool: packing only reads it.
  copy_blocks<true>(const_cast<uint16_t*>(k), const_cast<uint16_t*>(v), block_ids, n_ids,
                    block_halves, packed, stream, "launch_kv_pack_blocks");
}

void launch_kv_unpack_blocks(const uint16_t* packed, const int32_t* block_ids, int64_t n_ids,
                             int64_t block_halves, uint16_t* k, uint16_t* v, cudaStream_t stream) {
  // Unpacking only reads `packed`.
  copy_blocks<false>(k, v, block_ids, n_ids, block_halves, const_cast<uint16_t*>(packed), stream,
                     "launch_kv_unpack_blocks");
}

}  // namespace tokenfab::kernels
