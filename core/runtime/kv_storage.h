#pragma once
// The KV tensors of one device's paged pool: per layer, K and V as fp16
// (n_blocks, n_kv_head, block_size, head_dim). Which block belongs to whom is the bookkeeping of
// core/kvcache (KvManager); this class only holds the numbers, addressed by block id.

#include <cstdint>
#include <vector>

#include "core/model/llama_model.h"
#include "kernels/cpu/paged_attention.h"

namespace tokenfab {

class KvStorage {
 public:
  KvStorage(const HParams& hp, int32_t n_blocks, int32_t block_size);

  static uint64_t bytes_per_block(const HParams& hp, int32_t block_size);
  int32_t n_blocks() const { return n_blocks_; }
  int32_t block_size() const { return block_size_; }
  uint64_t bytes() const { return bytes_per_block(hp_, block_size_) * static_cast<uint64_t>(n_blocks_); }

  uint16_t* k(int64_t layer) { return k_[static_cast<size_t>(layer)].data(); }
  uint16_t* v(int64_t layer) { return v_[static_cast<size_t>(layer)].data(); }
  kernels::PagedKv layer_view(int64_t layer) const;
  // Element offset of (block, kv head, row within the block) in one layer's K or V.
  int64_t offset(int32_t block, int64_t kv_head, int64_t row) const {
    return ((static_cast<int64_t>(block) * hp_.n_kv_head + kv_head) * block_size_ + row) * hp_.head_dim;
  }
  // Copies block `src` onto `dst` in every layer (copy-on-write of a shared partial block).
  void copy_block(int32_t src, int32_t dst);

 private:
  const HParams& hp_;
  int32_t n_blocks_;
  int32_t block_size_;
  std::vector<std::vector<uint16_t>> k_;  // per layer
  std::vector<std::vector<uint16_t>> v_;
};

}  // namespace tokenfab
