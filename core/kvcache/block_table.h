#pragma once
// BlockTable: one sequence's view of the paged KV cache — its token ids, the blocks holding their
// KV in order, and the hash chain of its full blocks. Token i lives in blocks()[i / block_size],
// slot i % block_size.
//
// Writing rule: a sequence writes only into a block it holds alone (ref count 1). Its last,
// partial block may be shared after fork() or after a rollback into a shared block; the next
// append then copies it first (copy-on-write) and says so in AppendResult::copy, which the
// worker must carry out on the K/V tensors before writing. A sole-held block that is registered
// in the prefix cache is unregistered instead of copied.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/kvcache/prefix_cache.h"

namespace tokenfab {

enum class AppendStatus : uint8_t { kOk, kOutOfBlocks };

// Copy slots [0, n_tokens) of every layer's K and V from block `src` to block `dst`.
struct BlockCopy {
  BlockId src = -1;
  BlockId dst = -1;
  int32_t n_tokens = 0;
  // Where the copy reads and writes in the storage (BlockPool::slot), fixed when it is planned:
  // the released source block may take another slot before the copy runs (kv_slots.h).
  int32_t src_slot = -1;
  int32_t dst_slot = -1;
};

struct AppendResult {
  AppendStatus status = AppendStatus::kOk;
  std::optional<BlockCopy> copy;  // at most one: only the first, partial block can be shared
  bool ok() const { return status == AppendStatus::kOk; }
};

class BlockTable {
 public:
  BlockTable(SequenceId seq, int32_t block_size);

  SequenceId sequence() const { return seq_; }
  int32_t n_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t block_size() const { return block_size_; }
  const std::vector<TokenId>& tokens() const { return tokens_; }
  const std::vector<BlockId>& blocks() const { return blocks_; }
  // Hash chain of the full blocks: full_block_hashes()[i] names blocks()[i] and its prefix.
  const std::vector<uint64_t>& full_block_hashes() const { return hashes_; }

  // Takes references on `blocks` (full blocks found in the prefix cache for `tokens`, in order)
  // as this sequence's first blocks. Only valid on an empty table;
  // tokens.size() == blocks.size() × block_size, hashes.size() == blocks.size().
  void adopt_prefix(std::span<const BlockId> blocks, std::span<const TokenId> tokens,
                    std::span<const uint64_t> hashes, PrefixCache& cache);

  // New blocks that appending `n_new` tokens needs (a copy-on-write counts as one).
  int32_t blocks_needed(int32_t n_new, const BlockPool& pool) const;

  // Appends all `tokens` or, when the cache cannot supply blocks_needed(), none of them.
  // Blocks that become full are registered in the prefix cache.
  // `register_full` false: blocks filled by these tokens are hashed but not offered to the prefix
  // cache (a draft tree's slots do not hold their tokens' KV in sequence order; rewrite() later
  // puts the accepted tokens in place and registers).
  AppendResult append(std::span<const TokenId> tokens, PrefixCache& cache,
                      bool register_full = true);
  // Replaces tokens [from, from + tokens.size()) (all within the table) and re-hashes the full
  // blocks from the first one changed, registering each with the prefix cache under its new hash
  // (the caller has put the matching KV in those slots).
  void rewrite(int32_t from, std::span<const TokenId> tokens, PrefixCache& cache);

  // Rolls back to the first `n_tokens` tokens (≤ n_tokens()), releasing blocks past them,
  // last first. A block cut in two stays; the next append writes into it (or copies it).
  void truncate(int32_t n_tokens, PrefixCache& cache);

  // A table for `child` sharing every block (one more reference each).
  BlockTable fork(SequenceId child, PrefixCache& cache) const;
  // The shared partial block that the next append must copy, if any.
  std::optional<BlockId> copy_on_write_block(const BlockPool& pool) const;

  // Releases every block, last first (so in the LRU the prefix outlives the tail).
  void release_all(PrefixCache& cache);

  // First inconsistency between this table and the pool (coverage, hash chain, token counts).
  std::string check_invariants(const BlockPool& pool) const;

 private:
  int32_t tokens_in_last_block() const;

  SequenceId seq_;
  int32_t block_size_;
  std::vector<TokenId> tokens_;   // (n_tokens)
  std::vector<BlockId> blocks_;   // (ceil(n_tokens / block_size))
  std::vector<uint64_t> hashes_;  // (n_tokens / block_size)
};

}  // namespace tokenfab
