#pragma once
// The KV tensors of one device's paged pool: per layer, K and V as fp16
// (n_blocks, n_kv_head, block_size, head_dim). Which block belongs to whom is the bookkeeping of
// core/kvcache (KvManager); this class only holds the numbers, addressed by block id. It is the
// KvBlockStore a KvConnector copies from and into: one block of one layer is one contiguous run
// of n_kv_head · block_size · head_dim halves in K and one in V.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/model/llama_model.h"
#include "core/transfer/kv_connector.h"
#include "kernels/cpu/paged_attention.h"

namespace tokenfab {

// A device's paged KV pool as the serving loop sees it: the blocks a connector moves, plus the
// two copies the scheduler asks for. KvStorage (host memory, below) and the CUDA device's pool
// (core/device/cuda_model.h) implement it.
class KvPool : public KvBlockStore {
 public:
  // Copies block `src` onto `dst` in every layer (copy-on-write of a shared partial block).
  virtual void copy_block(int32_t src, int32_t dst) = 0;
  // Copies the K/V of position `from` onto position `to` of the sequence whose block table is
  // `blocks`, in every layer and kv head (a draft tree's accepted rows moved onto the chain).
  virtual void copy_position(std::span<const int32_t> blocks, int64_t from, int64_t to) = 0;
  // Returns once the copies above have landed (a GPU queues them on its stream; the host's are
  // done when they return). Called before a block of this pool gives its storage slot to a pool
  // on another stream (core/kvcache/kv_slots.h), and before a connector, on a stream of its own,
  // starts writing blocks that such a copy may still be writing (Worker::handle_incoming).
  virtual void fence() {}
};

class KvStorage final : public KvPool {
 public:
  KvStorage(const HParams& hp, int32_t n_blocks, int32_t block_size, std::string device = "cpu:0");

  static uint64_t bytes_per_block(const HParams& hp, int32_t block_size);
  // KvBlockStore
  std::string_view device() const override { return device_; }
  KvMemory memory() const override { return KvMemory::kHost; }
  int32_t n_layers() const override { return static_cast<int32_t>(hp_.n_layer); }
  int32_t n_blocks() const override { return n_blocks_; }
  int32_t block_size() const override { return block_size_; }
  size_t block_bytes() const override {
    return static_cast<size_t>(hp_.n_kv_head) * block_size_ * hp_.head_dim * sizeof(uint16_t);
  }
  std::byte* k_block(int32_t layer, int32_t block) override {
    return reinterpret_cast<std::byte*>(k(layer) + offset(block, 0, 0));
  }
  std::byte* v_block(int32_t layer, int32_t block) override {
    return reinterpret_cast<std::byte*>(v(layer) + offset(block, 0, 0));
  }

  uint64_t bytes() const {
    return bytes_per_block(hp_, block_size_) * static_cast<uint64_t>(n_blocks_);
  }

  uint16_t* k(int64_t layer) { return k_[static_cast<size_t>(layer)].get(); }
  uint16_t* v(int64_t layer) { return v_[static_cast<size_t>(layer)].get(); }
  kernels::PagedKv layer_view(int64_t layer) const;
  // Element offset of (block, kv head, row within the block) in one layer's K or V.
  int64_t offset(int32_t block, int64_t kv_head, int64_t row) const {
    return ((static_cast<int64_t>(block) * hp_.n_kv_head + kv_head) * block_size_ + row) *
           hp_.head_dim;
  }
  void copy_block(int32_t src, int32_t dst) override;
  void copy_position(std::span<const int32_t> blocks, int64_t from, int64_t to) override;

 private:
  const HParams& hp_;
  std::string device_;
  int32_t n_blocks_;
  int32_t block_size_;
  // Per layer. Left uninitialised: the OS maps pages as blocks are first written, so a large
  // budget costs memory only as it is used (no slot is read before it is written).
  std::vector<std::unique_ptr<uint16_t[]>> k_;
  std::vector<std::unique_ptr<uint16_t[]>> v_;
};

}  // namespace tokenfab
