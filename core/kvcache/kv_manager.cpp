#include "core/kvcache/kv_manager.h"

#include <algorithm>
#include <map>
#include <utility>

#include "core/common/error.h"

namespace tokenfab {

KvManager::KvManager(int32_t n_blocks, int32_t block_size, std::shared_ptr<KvSlots> shared)
    : pool_(n_blocks, block_size, std::move(shared)), cache_(pool_) {}

void KvManager::storage_slots(SequenceId seq, std::vector<int32_t>& out) const {
  const std::vector<BlockId>& blocks = table(seq).blocks();
  out.resize(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) out[i] = pool_.slot(blocks[i]);
}

void KvManager::adopt_slots(SequenceId seq, int32_t first, std::span<const int32_t> adopted) {
  const std::vector<BlockId>& blocks = table(seq).blocks();
  if (first < 0 || static_cast<size_t>(first) + adopted.size() > blocks.size())
    throw Error("kv cache: sequence " + std::to_string(seq) + " has " +
                std::to_string(blocks.size()) + " blocks; cannot adopt " +
                std::to_string(adopted.size()) + " slots from block " + std::to_string(first));
  // Checked first, so that a bad call changes nothing.
  for (size_t i = 0; i < adopted.size(); ++i)
    if (pool_.record(blocks[static_cast<size_t>(first) + i]).state != BlockState::kOwned ||
        !pool_.shares_slots())
      throw Error("kv cache: sequence " + std::to_string(seq) +
                  " cannot adopt slots: its pool has storage of its own, or a block is not owned");
  for (size_t i = 0; i < adopted.size(); ++i)
    pool_.adopt_slot(blocks[static_cast<size_t>(first) + i], adopted[i]);
}

const BlockTable& KvManager::table(SequenceId seq) const {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) {
    throw Error("kv cache: unknown sequence " + std::to_string(seq));
  }
  return it->second;
}

BlockTable& KvManager::mutable_table(SequenceId seq) {
  return const_cast<BlockTable&>(static_cast<const KvManager*>(this)->table(seq));
}

std::vector<SequenceId> KvManager::sequences() const {
  std::vector<SequenceId> ids;
  ids.reserve(tables_.size());
  for (const auto& [id, table] : tables_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

KvManager::PrefixHit KvManager::find_prefix(std::span<const TokenId> prompt) const {
  PrefixHit hit;
  const int32_t bs = block_size();
  const auto n = static_cast<int32_t>(prompt.size());
  hit.n_eligible = n > 0 ? (n - 1) / bs : 0;
  uint64_t parent = PrefixCache::kRootHash;
  for (int32_t i = 0; i < hit.n_eligible; ++i) {
    const uint64_t hash = PrefixCache::hash_block(
        parent, prompt.subspan(static_cast<size_t>(i) * bs, static_cast<size_t>(bs)));
    const std::optional<BlockId> id = cache_.find(hash);
    if (!id) break;
    hit.blocks.push_back(*id);
    hit.hashes.push_back(hash);
    if (pool_.record(*id).state == BlockState::kCached) ++hit.n_cached_hits;
    parent = hash;
  }
  return hit;
}

int32_t KvManager::blocks_needed_for_prompt(std::span<const TokenId> prompt) const {
  const int32_t bs = block_size();
  const auto n = static_cast<int32_t>(prompt.size());
  return (n + bs - 1) / bs - static_cast<int32_t>(find_prefix(prompt).blocks.size());
}

bool KvManager::fits(const PrefixHit& hit, int32_t n_prompt_tokens) const {
  const int32_t bs = block_size();
  const int32_t needed = (n_prompt_tokens + bs - 1) / bs - static_cast<int32_t>(hit.blocks.size());
  return needed <= cache_.n_available() - hit.n_cached_hits;
}

bool KvManager::can_allocate(std::span<const TokenId> prompt) const {
  return fits(find_prefix(prompt), static_cast<int32_t>(prompt.size()));
}

std::optional<int32_t> KvManager::allocate_sequence(SequenceId seq,
                                                    std::span<const TokenId> prompt) {
  if (has_sequence(seq)) {
    throw Error("kv cache: sequence " + std::to_string(seq) + " is already allocated");
  }
  const PrefixHit hit = find_prefix(prompt);
  if (!fits(hit, static_cast<int32_t>(prompt.size()))) return std::nullopt;
  const auto n_hit = static_cast<int32_t>(hit.blocks.size());
  const int32_t hit_tokens = n_hit * block_size();

  BlockTable table(seq, block_size());
  table.adopt_prefix(hit.blocks, prompt.first(static_cast<size_t>(hit_tokens)), hit.hashes, cache_);
  const AppendResult appended =
      table.append(prompt.subspan(static_cast<size_t>(hit_tokens)), cache_);
  if (!appended.ok()) {  // unreachable after fits(); undo rather than leave half a table
    table.release_all(cache_);
    return std::nullopt;
  }
  cache_.record_lookup(n_hit, hit.n_eligible - n_hit, hit_tokens,
                       static_cast<int32_t>(prompt.size()) - hit_tokens);
  tables_.emplace(seq, std::move(table));
  return hit_tokens;
}

int32_t KvManager::blocks_needed(SequenceId seq, int32_t n_new_tokens) const {
  return table(seq).blocks_needed(n_new_tokens, pool_);
}

bool KvManager::can_append(SequenceId seq, int32_t n_new_tokens) const {
  return blocks_needed(seq, n_new_tokens) <= cache_.n_available();
}

AppendResult KvManager::append(SequenceId seq, TokenId token) {
  return append(seq, std::span<const TokenId>(&token, 1));
}

AppendResult KvManager::append(SequenceId seq, std::span<const TokenId> tokens,
                               bool register_full) {
  return mutable_table(seq).append(tokens, cache_, register_full);
}

void KvManager::rewrite(SequenceId seq, int32_t from, std::span<const TokenId> tokens) {
  mutable_table(seq).rewrite(from, tokens, cache_);
}

void KvManager::truncate(SequenceId seq, int32_t n_tokens) {
  mutable_table(seq).truncate(n_tokens, cache_);
}

void KvManager::fork(SequenceId parent, SequenceId child) {
  const BlockTable& from = table(parent);
  if (has_sequence(child)) {
    throw Error("kv cache: fork target sequence " + std::to_string(child) + " already exists");
  }
  tables_.emplace(child, from.fork(child, cache_));
}

void KvManager::free_sequence(SequenceId seq) {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) {
    throw Error("kv cache: free of unknown sequence " + std::to_string(seq) +
                " (never allocated or already freed)");
  }
  it->second.release_all(cache_);
  tables_.erase(it);
}

int32_t KvManager::evict(int32_t n) {
  int32_t evicted = 0;
  while (evicted < n && cache_.evict_lru()) ++evicted;
  return evicted;
}

KvSnapshot KvManager::snapshot() const {
  return KvSnapshot::capture(pool_, cache_, static_cast<int32_t>(tables_.size()));
}

std::string KvManager::check_invariants() const {
  if (std::string e = pool_.check_invariants(); !e.empty()) return e;
  if (std::string e = cache_.check_invariants(); !e.empty()) return e;
  // (block, sequence) → how many times the sequence lists the block, from both sides.
  std::map<std::pair<BlockId, SequenceId>, int32_t> listed;
  std::map<std::pair<BlockId, SequenceId>, int32_t> owned;
  for (const auto& [seq, table] : tables_) {
    if (std::string e = table.check_invariants(pool_); !e.empty()) return e;
    for (const BlockId id : table.blocks()) ++listed[{id, seq}];
  }
  for (BlockId id = 0; id < pool_.n_blocks(); ++id) {
    for (const SequenceId seq : pool_.record(id).owners) ++owned[{id, seq}];
  }
  if (listed != owned) {
    for (const auto& [key, count] : owned) {
      const auto it = listed.find(key);
      if (it == listed.end() || it->second != count) {
        return "block " + std::to_string(key.first) + ": owner " + std::to_string(key.second) +
               " does not list it in its table";
      }
    }
    return "a table lists a block it does not own";
  }
  return {};
}

}  // namespace tokenfab
