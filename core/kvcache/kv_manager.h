#pragma once
// KvManager: the KV bookkeeping of one device — a BlockPool, its PrefixCache and one BlockTable
// per sequence. The scheduler asks it for room (can_allocate / can_append), and running out of
// blocks is a return value it answers by preempting; misuse (unknown sequence, a sequence
// allocated twice) throws tokenfab::Error.
//
// Prefix reuse: a prompt of n tokens looks up its first (n - 1) / block_size full blocks — at
// least one token is always left to compute, since its logits start the decode.
// Blocks are registered in the prefix cache as soon as their tokens are fixed (at allocate and
// append), before the worker has written their KV — as nano-vllm does. Contract for the
// scheduler: a sequence whose prefix hit blocks another sequence is still prefilling (chunked
// prefill over several steps) must not attend over them before that prefill has covered them.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/kvcache/block_pool.h"
#include "core/kvcache/block_table.h"
#include "core/kvcache/kv_snapshot.h"
#include "core/kvcache/prefix_cache.h"

namespace tokenfab {

class KvManager {
 public:
  // With `shared`, the pool's blocks map onto slots of storage shared with another pool (see
  // BlockPool and KvSlots).
  explicit KvManager(int32_t n_blocks, int32_t block_size = kDefaultBlockSize,
                     std::shared_ptr<KvSlots> shared = nullptr);
  KvManager(const KvManager&) = delete;  // the cache keeps a reference to the pool
  KvManager& operator=(const KvManager&) = delete;

  int32_t block_size() const { return pool_.block_size(); }

  // New blocks a prompt needs after prefix reuse, and whether the pool (free + evictable) has them.
  int32_t blocks_needed_for_prompt(std::span<const TokenId> prompt) const;
  bool can_allocate(std::span<const TokenId> prompt) const;

  // Creates `seq` holding `prompt`; returns how many leading prompt tokens were found in the
  // prefix cache (their KV need not be computed), or nullopt — with nothing changed — when the
  // pool is short of blocks.
  std::optional<int32_t> allocate_sequence(SequenceId seq, std::span<const TokenId> prompt);

  int32_t blocks_needed(SequenceId seq, int32_t n_new_tokens = 1) const;
  bool can_append(SequenceId seq, int32_t n_new_tokens = 1) const;
  AppendResult append(SequenceId seq, TokenId token);
  // register_full false: see BlockTable::append (draft trees).
  AppendResult append(SequenceId seq, std::span<const TokenId> tokens, bool register_full = true);
  // BlockTable::rewrite of `seq`'s table.
  void rewrite(SequenceId seq, int32_t from, std::span<const TokenId> tokens);

  // Rolls `seq` back to its first `n_tokens` tokens (rejected speculative tokens).
  void truncate(SequenceId seq, int32_t n_tokens);
  // `child` shares all of `parent`'s blocks; the first append to a shared partial block copies it.
  void fork(SequenceId parent, SequenceId child);
  void free_sequence(SequenceId seq);

  // Where the K/V of `seq`'s blocks live in the storage (BlockPool::slot), in table order.
  void storage_slots(SequenceId seq, std::vector<int32_t>& out) const;
  // `seq`'s blocks [first, first + adopted.size()) adopt `adopted` (BlockPool::adopt_slot): the
  // storage's blocks that already hold their KV. Throws unless the pool shares its storage.
  void adopt_slots(SequenceId seq, int32_t first, std::span<const int32_t> adopted);

  // Frees up to `n` unreferenced cached blocks, least recently used first; returns how many.
  int32_t evict(int32_t n);
  int32_t evict_all() { return evict(pool_.n_blocks()); }

  bool has_sequence(SequenceId seq) const { return tables_.count(seq) != 0; }
  const BlockTable& table(SequenceId seq) const;
  std::vector<SequenceId> sequences() const;  // ascending
  int32_t n_sequences() const { return static_cast<int32_t>(tables_.size()); }
  int32_t n_available_blocks() const { return cache_.n_available(); }

  const BlockPool& pool() const { return pool_; }
  const PrefixCache& prefix_cache() const { return cache_; }
  KvSnapshot snapshot() const;

  // First violated invariant, or "": pool states and counts, cache index and LRU, each table's
  // coverage and hash chain, and every block's owners == the sequences whose tables list it.
  std::string check_invariants() const;

 private:
  // Leading full prompt blocks found in the cache (ids and their chain hashes).
  struct PrefixHit {
    std::vector<BlockId> blocks;
    std::vector<uint64_t> hashes;
    int32_t n_eligible = 0;     // full blocks looked up
    int32_t n_cached_hits = 0;  // hits now kCached (reusing them takes them off the LRU)
  };
  PrefixHit find_prefix(std::span<const TokenId> prompt) const;
  bool fits(const PrefixHit& hit, int32_t n_prompt_tokens) const;
  BlockTable& mutable_table(SequenceId seq);

  BlockPool pool_;
  PrefixCache cache_;
  std::unordered_map<SequenceId, BlockTable> tables_;
};

}  // namespace tokenfab
