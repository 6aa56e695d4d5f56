#include "core/kvcache/block_table.h"

#include <algorithm>

#include "core/common/error.h"

namespace tokenfab {

BlockTable::BlockTable(SequenceId seq, int32_t block_size) : seq_(seq), block_size_(block_size) {}

// Tokens in the last block when it is partial; 0 when the table is empty or ends on a full block.
int32_t BlockTable::tokens_in_last_block() const {
  return n_tokens() % block_size_;
}

void BlockTable::adopt_prefix(std::span<const BlockId> blocks, std::span<const TokenId> tokens,
                              std::span<const uint64_t> hashes, PrefixCache& cache) {
  if (!tokens_.empty() || tokens.size() != blocks.size() * static_cast<size_t>(block_size_) ||
      hashes.size() != blocks.size()) {
    throw Error("kv cache: adopt_prefix on a non-empty table or with mismatched sizes");
  }
  for (const BlockId id : blocks) cache.acquire(id, seq_);
  blocks_.assign(blocks.begin(), blocks.end());
  tokens_.assign(tokens.begin(), tokens.end());
  hashes_.assign(hashes.begin(), hashes.end());
}

std::optional<BlockId> BlockTable::copy_on_write_block(const BlockPool& pool) const {
  if (tokens_in_last_block() == 0) return std::nullopt;
  const BlockId last = blocks_.back();
  const BlockRecord& r = pool.record(last);
  if (r.ref_count > 1) return last;
  // A storage slot that another block (of another pool: kv_slots.h) also maps is never written.
  if (pool.slot_shared(last)) return last;
  return std::nullopt;
}

int32_t BlockTable::blocks_needed(int32_t n_new, const BlockPool& pool) const {
  if (n_new <= 0) return 0;
  int32_t needed = 0;
  int32_t room = 0;  // free slots in the current partial block
  if (const int32_t in_last = tokens_in_last_block(); in_last > 0) {
    room = block_size_ - in_last;
    if (copy_on_write_block(pool)) ++needed;
  }
  const int32_t rest = n_new - room;
  if (rest > 0) needed += (rest + block_size_ - 1) / block_size_;
  return needed;
}

AppendResult BlockTable::append(std::span<const TokenId> tokens, PrefixCache& cache,
                                bool register_full) {
  AppendResult result;
  if (tokens.empty()) return result;
  BlockPool& pool = cache.pool();
  if (blocks_needed(static_cast<int32_t>(tokens.size()), pool) > cache.n_available()) {
    result.status = AppendStatus::kOutOfBlocks;
    return result;
  }
  // Make the partial last block writable: copy it if shared, forget its hash if registered.
  if (const int32_t in_last = tokens_in_last_block(); in_last > 0) {
    const BlockId last = blocks_.back();
    if (copy_on_write_block(pool)) {
      const BlockId copy = *cache.allocate_block(seq_);  // counted in blocks_needed
      pool.set_tokens(copy, in_last);
      cache.release(last, seq_);
      blocks_.back() = copy;
      result.copy = BlockCopy{last, copy, in_last, pool.slot(last), pool.slot(copy)};
    } else if (pool.record(last).has_hash) {
      cache.unregister(last);
    }
  }
  for (const TokenId token : tokens) {
    const int32_t slot = n_tokens() % block_size_;
    if (slot == 0) blocks_.push_back(*cache.allocate_block(seq_));
    tokens_.push_back(token);
    const BlockId last = blocks_.back();
    pool.set_tokens(last, slot + 1);
    if (slot + 1 == block_size_) {
      const uint64_t parent = hashes_.empty() ? PrefixCache::kRootHash : hashes_.back();
      const std::span<const TokenId> block_tokens(tokens_.data() + tokens_.size() - block_size_,
                                                  static_cast<size_t>(block_size_));
      hashes_.push_back(PrefixCache::hash_block(parent, block_tokens));
      if (register_full) cache.register_block(last, hashes_.back());
    }
  }
  return result;
}

void BlockTable::rewrite(int32_t from, std::span<const TokenId> tokens, PrefixCache& cache) {
  const auto end = from + static_cast<int64_t>(tokens.size());
  if (from < 0 || end > n_tokens())
    throw Error("kv cache: sequence " + std::to_string(seq_) + " cannot rewrite tokens [" +
                std::to_string(from) + ", " + std::to_string(end) + ") of " +
                std::to_string(n_tokens()));
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + from);
  BlockPool& pool = cache.pool();
  for (size_t b = static_cast<size_t>(from / block_size_); b < hashes_.size(); ++b) {
    const uint64_t parent = b == 0 ? PrefixCache::kRootHash : hashes_[b - 1];
    const std::span<const TokenId> block_tokens(tokens_.data() + b * block_size_,
                                                static_cast<size_t>(block_size_));
    hashes_[b] = PrefixCache::hash_block(parent, block_tokens);
    const BlockId id = blocks_[b];
    const BlockRecord& r = pool.record(id);
    if (r.has_hash && r.hash == hashes_[b]) continue;
    if (r.has_hash) cache.unregister(id);
    cache.register_block(id, hashes_[b]);
  }
}

void BlockTable::truncate(int32_t n_tokens, PrefixCache& cache) {
  if (n_tokens < 0 || n_tokens > this->n_tokens()) {
    throw Error("kv cache: sequence " + std::to_string(seq_) + " cannot roll back to " +
                std::to_string(n_tokens) + " tokens (it has " + std::to_string(this->n_tokens()) +
                ")");
  }
  const size_t keep_blocks = static_cast<size_t>((n_tokens + block_size_ - 1) / block_size_);
  while (blocks_.size() > keep_blocks) {
    cache.release(blocks_.back(), seq_);
    blocks_.pop_back();
  }
  tokens_.resize(static_cast<size_t>(n_tokens));
  hashes_.resize(static_cast<size_t>(n_tokens / block_size_));
  // A sole-held, unregistered block cut in two now holds only our tokens. A shared or registered
  // one keeps its count: its other slots are still valid for other owners or the cache.
  if (const int32_t in_last = tokens_in_last_block(); in_last > 0) {
    BlockPool& pool = cache.pool();
    const BlockRecord& r = pool.record(blocks_.back());
    if (r.ref_count == 1 && !r.has_hash) pool.set_tokens(blocks_.back(), in_last);
  }
}

BlockTable BlockTable::fork(SequenceId child, PrefixCache& cache) const {
  BlockTable copy(child, block_size_);
  for (const BlockId id : blocks_) cache.acquire(id, child);
  copy.tokens_ = tokens_;
  copy.blocks_ = blocks_;
  copy.hashes_ = hashes_;
  return copy;
}

void BlockTable::release_all(PrefixCache& cache) {
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) cache.release(*it, seq_);
  blocks_.clear();
  tokens_.clear();
  hashes_.clear();
}

std::string BlockTable::check_invariants(const BlockPool& pool) const {
  const std::string where = "sequence " + std::to_string(seq_) + ": ";
  const size_t want_blocks = static_cast<size_t>((n_tokens() + block_size_ - 1) / block_size_);
  if (blocks_.size() != want_blocks) {
    return where + std::to_string(blocks_.size()) + " blocks for " + std::to_string(n_tokens()) +
           " tokens";
  }
  if (hashes_.size() != static_cast<size_t>(n_tokens() / block_size_)) {
    return where + "hash chain length != full blocks";
  }
  uint64_t parent = PrefixCache::kRootHash;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const BlockRecord& r = pool.record(blocks_[i]);
    const std::string at = where + "block " + std::to_string(blocks_[i]) + ": ";
    if (r.state != BlockState::kOwned) return at + "listed but not owned";
    const int32_t held = std::min(block_size_, n_tokens() - static_cast<int32_t>(i) * block_size_);
    if (r.n_tokens < held) return at + "holds fewer tokens than the sequence uses";
    if (held < block_size_) continue;
    const uint64_t hash = PrefixCache::hash_block(
        parent, std::span<const TokenId>(tokens_.data() + i * static_cast<size_t>(block_size_),
                                         static_cast<size_t>(block_size_)));
    if (hashes_[i] != hash) return at + "hash chain does not match the tokens";
    if (r.has_hash && r.hash != hash) return at + "registered under another hash";
    parent = hash;
  }
  return {};
}

}  // namespace tokenfab
