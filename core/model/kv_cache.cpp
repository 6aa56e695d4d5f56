#include "core/model/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace tokenfab {

void KvCache::reserve(int64_t positions) {
  if (positions <= capacity_) return;
  const int64_t grown = std::max(positions, capacity_ + capacity_ / 2);
  // Each head's rows move to the new head stride; only the filled positions are copied.
  const auto regrow = [&](std::vector<uint16_t>& layer) {
    std::vector<uint16_t> next(static_cast<size_t>(n_kv_head_ * grown * head_dim_));
    for (int64_t h = 0; h < n_kv_head_ && size_ > 0; ++h)
      std::memcpy(next.data() + h * grown * head_dim_, layer.data() + h * capacity_ * head_dim_,
                  static_cast<size_t>(size_ * head_dim_) * sizeof(uint16_t));
    layer = std::move(next);
  };
  for (auto& layer : k_) regrow(layer);
  for (auto& layer : v_) regrow(layer);
  capacity_ = grown;
}

uint64_t KvCache::bytes() const {
  return 2 * k_.size() * static_cast<uint64_t>(n_kv_head_ * capacity_ * head_dim_) * sizeof(uint16_t);
}

}  // namespace tokenfab
