#pragma once
// The single-sequence KV cache of the forward pass: per layer, K and V rows for positions
// 0 .. size()-1, contiguous, stored as fp16. (The paged, multi-sequence cache lives in
// core/kvcache.)

#include <cstdint>
#include <vector>

namespace tokenfab {

class KvCache {
 public:
  KvCache(int64_t n_layer, int64_t kv_dim) : kv_dim_(kv_dim), k_(n_layer), v_(n_layer) {}

  int64_t size() const { return size_; }          // positions filled
  int64_t capacity() const { return capacity_; }  // positions allocated
  int64_t kv_dim() const { return kv_dim_; }
  // Grows (keeping contents) so that `positions` fit; grows geometrically.
  void reserve(int64_t positions);
  void set_size(int64_t positions) { size_ = positions; }  // after a forward, or to roll back
  void clear() { size_ = 0; }

  uint16_t* k(int64_t layer) { return k_[layer].data(); }  // fp16 (capacity, kv_dim)
  uint16_t* v(int64_t layer) { return v_[layer].data(); }
  uint64_t bytes() const;

 private:
  int64_t kv_dim_;
  int64_t size_ = 0;
  int64_t capacity_ = 0;
  std::vector<std::vector<uint16_t>> k_;
  std::vector<std::vector<uint16_t>> v_;
};

}  // namespace tokenfab
