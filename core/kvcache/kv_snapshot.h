#pragma once
// KvSnapshot: a read-only copy of one pool's block records and totals, taken by the pool's owner
// between steps and handed to other threads (inspector, metrics, tests) by value. A copy, not a
// view: it stays consistent however the pool changes afterwards. Cost: O(n_blocks + owners).

#include <cstdint>
#include <vector>

#include "core/kvcache/block_pool.h"
#include "core/kvcache/prefix_cache.h"

namespace tokenfab {

struct KvSnapshot {
  int32_t block_size = 0;  // tokens per block
  int32_t n_blocks = 0;
  int32_t n_free = 0;
  int32_t n_owned = 0;
  int32_t n_cached = 0;  // n_free + n_owned + n_cached == n_blocks
  int32_t n_sequences = 0;
  PrefixCacheStats prefix;          // cumulative since the pool was made
  std::vector<BlockRecord> blocks;  // (n_blocks), indexed by BlockId
  // A pool over storage shared with another pool (a device's two partitions, kv_slots.h): each
  // block's storage slot and how many blocks of both pools map it ((n_blocks) each; 2: the KV is
  // shared with the other partition). Empty for a pool with storage of its own.
  std::vector<int32_t> block_slots, slot_refs;

  double prefix_hit_rate() const { return prefix.hit_rate(); }

  static KvSnapshot capture(const BlockPool& pool, const PrefixCache& cache, int32_t n_sequences);
};

}  // namespace tokenfab
