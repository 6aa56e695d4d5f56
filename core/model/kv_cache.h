#pragma once
// The single-sequence KV cache of the forward pass, stored as fp16. Per layer and kv head, the
// rows of positions 0 .. size()-1 are contiguous (head-major), so attention reads each head as one
// stream. (The paged, multi-sequence cache lives in core/kvcache.)

#include <cstdint>
#include <vector>

namespace tokenfab {

class KvCache {
 public:
  KvCache(int64_t n_layer, int64_t n_kv_head, int64_t head_dim)
      : n_kv_head_(n_kv_head), head_dim_(head_dim), k_(n_layer), v_(n_layer) {}

  int64_t size() const { return size_; }          // positions filled
  int64_t capacity() const { return capacity_; }  // positions allocated
  int64_t n_kv_head() const { return n_kv_head_; }
  int64_t head_dim() const { return head_dim_; }
  // Elements between the first rows of consecutive kv heads (changes when the cache grows).
  int64_t head_stride() const { return capacity_ * head_dim_; }
  // Grows (keeping contents) so that `positions` fit; grows geometrically.
  void reserve(int64_t positions);
  void set_size(int64_t positions) { size_ = positions; }  // after a forward, or to roll back
  void clear() { size_ = 0; }

  uint16_t* k(int64_t layer) { return k_[layer].data(); }  // fp16 (n_kv_head, capacity, head_dim)
  uint16_t* v(int64_t layer) { return v_[layer].data(); }
  uint64_t bytes() const;

 private:
  int64_t n_kv_head_;
  int64_t head_dim_;
  int64_t size_ = 0;
  int64_t capacity_ = 0;
  std::vector<std::vector<uint16_t>> k_;
  std::vector<std::vector<uint16_t>> v_;
};

}  // namespace tokenfab
