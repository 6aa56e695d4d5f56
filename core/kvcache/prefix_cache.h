#pragma once
// PrefixCache: full blocks of one BlockPool keyed by a hash chain, so a new sequence whose prompt
// starts with an already computed prefix (system prompt, earlier turns) reuses those blocks.
//
//   hash(block i) = XXH3_64(hash(block i-1) as 8 little-endian bytes ‖ block i's token ids as
//                           int32), with hash(block -1) = kRootHash.
// A hash therefore names a block's tokens *and* everything before them. Only full blocks are
// keyed. Two different chains colliding on 64 bits are treated as equal (probability ~n²/2⁶⁴).
//
// The cache holds no reference of its own (see block_pool.h): a registered block whose owners are
// all gone is kCached and waits on an LRU list; evict_lru() frees the least recently released one.
// Blocks released together should be released tail first, so a sequence's prefix outlives its
// tail in the LRU order.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/kvcache/block_pool.h"

namespace tokenfab {

// Lookup outcome counts, accumulated over successful sequence allocations. A lookup covers a
// prompt's eligible full blocks; hit tokens are served from the cache, miss tokens must be
// computed (all other prompt tokens).
struct PrefixCacheStats {
  int64_t hit_blocks = 0;
  int64_t miss_blocks = 0;
  int64_t hit_tokens = 0;
  int64_t miss_tokens = 0;
  // hit_tokens / (hit_tokens + miss_tokens): fraction of prompt tokens not recomputed; 0 if none.
  double hit_rate() const;
};

class PrefixCache {
 public:
  static constexpr uint64_t kRootHash = 0;

  explicit PrefixCache(BlockPool& pool);

  static uint64_t hash_block(uint64_t parent_hash, std::span<const TokenId> tokens);

  // The block registered under `hash`, owned or cached.
  std::optional<BlockId> find(uint64_t hash) const;

  // Registers an owned, full block under `hash`. Returns false (and changes nothing) when the
  // hash already names another block — the same tokens were computed twice; the newer copy stays
  // unregistered and is freed with its sequence.
  bool register_block(BlockId id, uint64_t hash);
  // Forgets an owned, registered block whose content is about to change (rollback into it).
  void unregister(BlockId id);

  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }

  // A free block for `owner`, evicting the least recently released cached block when the free
  // list is empty; nullopt when neither exists (the caller preempts).
  std::optional<BlockId> allocate_block(SequenceId owner);
  // Blocks allocate_block can still hand out: free + cached.
  int32_t n_available() const { return pool_.n_free() + n_lru_; }

  // Pool retain/release that keep the LRU list in step with the cached state.
  void acquire(BlockId id, SequenceId owner);
  void release(BlockId id, SequenceId owner);

  // Frees the least recently released cached block; nullopt when none is cached.
  std::optional<BlockId> evict_lru();
  int32_t n_evictable() const { return n_lru_; }
  // Cached blocks from least to most recently released.
  std::vector<BlockId> lru_order() const;

  void record_lookup(int32_t hit_blocks, int32_t miss_blocks, int32_t hit_tokens,
                     int32_t miss_tokens);
  const PrefixCacheStats& stats() const { return stats_; }

  // First inconsistency between the index, the LRU list and the pool, or "".
  std::string check_invariants() const;

 private:
  void lru_push_back(BlockId id);
  void lru_remove(BlockId id);

  BlockPool& pool_;
  std::unordered_map<uint64_t, BlockId> index_;  // hash → registered block
  // Intrusive doubly linked LRU list over block ids (no allocation per release); -1 = none.
  std::vector<BlockId> prev_;    // (n_blocks)
  std::vector<BlockId> next_;    // (n_blocks)
  std::vector<uint8_t> in_lru_;  // (n_blocks) 0/1
  BlockId head_ = -1;            // least recently released
  BlockId tail_ = -1;
  int32_t n_lru_ = 0;
  PrefixCacheStats stats_;
};

}  // namespace tokenfab
