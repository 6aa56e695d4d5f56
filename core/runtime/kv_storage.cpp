#include "core/runtime/kv_storage.h"

#include <algorithm>

#include "core/common/error.h"

namespace tokenfab {

KvStorage::KvStorage(const HParams& hp, int32_t n_blocks, int32_t block_size, std::string device)
    : hp_(hp), device_(std::move(device)), n_blocks_(n_blocks), block_size_(block_size) {
  if (n_blocks < 1 || block_size < 1)
    throw Error("a KV pool needs at least one block of at least one token (got " +
                std::to_string(n_blocks) + " blocks of " + std::to_string(block_size) + ")");
  const auto elems = static_cast<size_t>(n_blocks) * hp.n_kv_head * block_size * hp.head_dim;
  for (int64_t layer = 0; layer < hp.n_layer; ++layer) {
    k_.emplace_back(new uint16_t[elems]);  // default-initialised: not touched
    v_.emplace_back(new uint16_t[elems]);
  }
}

uint64_t KvStorage::bytes_per_block(const HParams& hp, int32_t block_size) {
  return 2ull * static_cast<uint64_t>(hp.n_layer) * hp.n_kv_head * static_cast<uint64_t>(block_size) *
         hp.head_dim * sizeof(uint16_t);
}

kernels::PagedKv KvStorage::layer_view(int64_t layer) const {
  return {k_[static_cast<size_t>(layer)].get(), v_[static_cast<size_t>(layer)].get(), block_size_,
          hp_.n_kv_head, hp_.head_dim};
}

void KvStorage::copy_block(int32_t src, int32_t dst) {
  const int64_t n = static_cast<int64_t>(hp_.n_kv_head) * block_size_ * hp_.head_dim;
  for (int64_t layer = 0; layer < hp_.n_layer; ++layer) {
    for (uint16_t* t : {k(layer), v(layer)})
      std::copy_n(t + offset(src, 0, 0), n, t + offset(dst, 0, 0));
  }
}

void KvStorage::copy_position(std::span<const int32_t> blocks, int64_t from, int64_t to) {
  const int32_t bs = block_size_;
  const int32_t src_block = blocks[static_cast<size_t>(from / bs)];
  const int32_t dst_block = blocks[static_cast<size_t>(to / bs)];
  for (int64_t layer = 0; layer < hp_.n_layer; ++layer)
    for (uint16_t* t : {k(layer), v(layer)})
      for (int64_t g = 0; g < hp_.n_kv_head; ++g)
        std::copy_n(t + offset(src_block, g, from % bs), hp_.head_dim,
                    t + offset(dst_block, g, to % bs));
}

}  // namespace tokenfab
