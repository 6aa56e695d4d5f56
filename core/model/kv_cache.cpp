#include "core/model/kv_cache.h"

#include <algorithm>

namespace tokenfab {

void KvCache::reserve(int64_t positions) {
  if (positions <= capacity_) return;
  const int64_t grown = std::max(positions, capacity_ + capacity_ / 2);
  for (auto& layer : k_) layer.resize(static_cast<size_t>(grown * kv_dim_));
  for (auto& layer : v_) layer.resize(static_cast<size_t>(grown * kv_dim_));
  capacity_ = grown;
}

uint64_t KvCache::bytes() const {
  return 2 * k_.size() * static_cast<uint64_t>(capacity_ * kv_dim_) * sizeof(uint16_t);
}

}  // namespace tokenfab
