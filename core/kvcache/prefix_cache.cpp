#include "core/kvcache/prefix_cache.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack: no allocation per hash
#include <xxhash.h>

#include "core/common/error.h"

namespace tokenfab {

double PrefixCacheStats::hit_rate() const {
  const int64_t total = hit_tokens + miss_tokens;
  return total == 0 ? 0.0 : static_cast<double>(hit_tokens) / static_cast<double>(total);
}

PrefixCache::PrefixCache(BlockPool& pool)
    : pool_(pool),
      prev_(static_cast<size_t>(pool.n_blocks()), -1),
      next_(static_cast<size_t>(pool.n_blocks()), -1),
      in_lru_(static_cast<size_t>(pool.n_blocks()), 0) {}

uint64_t PrefixCache::hash_block(uint64_t parent_hash, std::span<const TokenId> tokens) {
  // Fixed byte order so hashes are stable across runs and machines (x86/ARM are little-endian;
  // a big-endian host would need a swap here).
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &parent_hash, sizeof(parent_hash));
  XXH3_64bits_update(&state, tokens.data(), tokens.size_bytes());
  return XXH3_64bits_digest(&state);
}

std::optional<BlockId> PrefixCache::find(uint64_t hash) const {
  const auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

bool PrefixCache::register_block(BlockId id, uint64_t hash) {
  if (pool_.record(id).has_hash) {
    throw Error("kv cache: block " + std::to_string(id) + " is already registered");
  }
  if (!index_.try_emplace(hash, id).second) return false;
  pool_.set_hash(id, hash);
  return true;
}

void PrefixCache::unregister(BlockId id) {
  const BlockRecord& r = pool_.record(id);
  if (r.state != BlockState::kOwned || !r.has_hash) {
    throw Error("kv cache: unregister of block " + std::to_string(id) +
                " which is not owned and registered");
  }
  index_.erase(r.hash);
  pool_.clear_hash(id);
}

void PrefixCache::acquire(BlockId id, SequenceId owner) {
  if (pool_.record(id).state == BlockState::kCached) lru_remove(id);
  pool_.retain(id, owner);
}

void PrefixCache::release(BlockId id, SequenceId owner) {
  if (pool_.release(id, owner) == BlockState::kCached) lru_push_back(id);
}

std::optional<BlockId> PrefixCache::allocate_block(SequenceId owner) {
  if (pool_.n_free() == 0 && !evict_lru()) return std::nullopt;
  return pool_.allocate(owner);
}

std::optional<BlockId> PrefixCache::evict_lru() {
  if (head_ < 0) return std::nullopt;
  const BlockId id = head_;
  lru_remove(id);
  index_.erase(pool_.record(id).hash);
  pool_.evict(id);
  return id;
}

std::vector<BlockId> PrefixCache::lru_order() const {
  std::vector<BlockId> order;
  order.reserve(static_cast<size_t>(n_lru_));
  for (BlockId id = head_; id >= 0; id = next_[static_cast<size_t>(id)]) order.push_back(id);
  return order;
}

void PrefixCache::record_lookup(int32_t hit_blocks, int32_t miss_blocks, int32_t hit_tokens,
                                int32_t miss_tokens) {
  stats_.hit_blocks += hit_blocks;
  stats_.miss_blocks += miss_blocks;
  stats_.hit_tokens += hit_tokens;
  stats_.miss_tokens += miss_tokens;
}

void PrefixCache::lru_push_back(BlockId id) {
  const auto i = static_cast<size_t>(id);
  prev_[i] = tail_;
  next_[i] = -1;
  if (tail_ >= 0) {
    next_[static_cast<size_t>(tail_)] = id;
  } else {
    head_ = id;
  }
  tail_ = id;
  in_lru_[i] = 1;
  ++n_lru_;
}

void PrefixCache::lru_remove(BlockId id) {
  const auto i = static_cast<size_t>(id);
  if (!in_lru_[i]) throw Error("kv cache: block " + std::to_string(id) + " is not on the LRU");
  const BlockId p = prev_[i];
  const BlockId n = next_[i];
  if (p >= 0) {
    next_[static_cast<size_t>(p)] = n;
  } else {
    head_ = n;
  }
  if (n >= 0) {
    prev_[static_cast<size_t>(n)] = p;
  } else {
    tail_ = p;
  }
  prev_[i] = next_[i] = -1;
  in_lru_[i] = 0;
  --n_lru_;
}

std::string PrefixCache::check_invariants() const {
  int32_t n_registered = 0;
  for (BlockId id = 0; id < pool_.n_blocks(); ++id) {
    const BlockRecord& r = pool_.record(id);
    const std::string where = "block " + std::to_string(id) + ": ";
    const bool cached = r.state == BlockState::kCached;
    if (cached != (in_lru_[static_cast<size_t>(id)] != 0)) {
      return where + (cached ? "cached but not on the LRU list" : "on the LRU list, not cached");
    }
    if (!r.has_hash) continue;
    ++n_registered;
    const auto it = index_.find(r.hash);
    if (it == index_.end() || it->second != id) return where + "registered but not indexed";
  }
  if (n_registered != static_cast<int32_t>(index_.size())) {
    return "index holds " + std::to_string(index_.size()) + " hashes but " +
           std::to_string(n_registered) + " blocks are registered";
  }
  if (static_cast<int32_t>(lru_order().size()) != n_lru_) return "LRU list length != count";
  return {};
}

}  // namespace tokenfab
