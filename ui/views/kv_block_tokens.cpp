#include "ui/views/kv_block_tokens.h"

#include <span>

#include "core/kvcache/prefix_cache.h"

namespace tokenfab::ui {

namespace {

bool owns(const BlockRecord& r, SequenceId id) {
  for (const SequenceId o : r.owners)
    if (o == id) return true;
  return false;
}

// Output tokens at sequence positions [first, first + n), when all of them are outputs.
std::optional<std::span<const TokenId>> output_span(const RequestInfo& r, int64_t first,
                                                    int64_t n) {
  const int64_t begin = first - r.n_prompt;
  if (begin < 0 || begin + n > static_cast<int64_t>(r.output.size())) return std::nullopt;
  return std::span<const TokenId>(r.output).subspan(static_cast<size_t>(begin),
                                                    static_cast<size_t>(n));
}

// A hashed, full block: find the position whose output tokens, chained to another block of the
// request, reproduce its hash.
std::optional<BlockTokens> from_hash(const KvSnapshot& kv, const BlockRecord& record,
                                     const RequestInfo& r) {
  const int32_t bs = kv.block_size;
  std::vector<uint64_t> parents;  // hashes of the request's other registered blocks
  for (const BlockRecord& other : kv.blocks)
    if (&other != &record && other.has_hash && owns(other, r.id)) parents.push_back(other.hash);
  const int64_t n_tokens = r.n_prompt + static_cast<int64_t>(r.output.size());
  std::optional<BlockTokens> found;
  for (int64_t i = (r.n_prompt + bs - 1) / bs; (i + 1) * bs <= n_tokens; ++i) {
    const auto tokens = output_span(r, i * bs, bs);
    if (!tokens) continue;
    for (const uint64_t parent : parents) {
      if (PrefixCache::hash_block(parent, *tokens) != record.hash) continue;
      if (found) {  // the same tokens after another of its blocks: content proven, place not
        found->first_position = -1;
        return found;
      }
      found = BlockTokens{r.id, static_cast<int32_t>(i * bs), {tokens->begin(), tokens->end()}, {}};
      break;
    }
  }
  return found;
}

// A partially filled block is the request's tail block on this device.
std::optional<BlockTokens> from_tail(const KvSnapshot& kv, const BlockRecord& record,
                                     const RequestInfo& r) {
  int64_t written_blocks = 0;
  for (const BlockRecord& other : kv.blocks)
    if (other.n_tokens > 0 && owns(other, r.id)) ++written_blocks;
  const int64_t first = (written_blocks - 1) * kv.block_size;
  const auto tokens = output_span(r, first, record.n_tokens);
  if (!tokens) return std::nullopt;
  return BlockTokens{r.id, static_cast<int32_t>(first), {tokens->begin(), tokens->end()}, {}};
}

}  // namespace

BlockTokens block_tokens(const KvSnapshot& kv, BlockId block,
                         const std::vector<RequestInfo>& requests) {
  BlockTokens out;
  if (block < 0 || block >= static_cast<BlockId>(kv.blocks.size())) {
    out.unavailable = "no such block";
    return out;
  }
  const BlockRecord& record = kv.blocks[static_cast<size_t>(block)];
  if (record.state == BlockState::kFree) {
    out.unavailable = "free block: no tokens";
    return out;
  }
  if (record.state == BlockState::kCached) {
    out.unavailable = "tokens not available for cached blocks (no live request holds them)";
    return out;
  }
  if (record.n_tokens == 0) {
    out.unavailable = "no tokens written yet (reserved for the next step)";
    return out;
  }
  bool live_owner = false;
  for (const SequenceId owner : record.owners) {
    for (const RequestInfo& r : requests) {
      if (r.id != owner) continue;
      live_owner = true;
      std::optional<BlockTokens> found;
      if (record.has_hash && record.n_tokens == kv.block_size)
        found = from_hash(kv, record, r);
      else if (record.n_tokens < kv.block_size)
        found = from_tail(kv, record, r);
      if (found) return *found;
    }
  }
  out.unavailable = live_owner
                        ? "tokens not available: this block holds prompt tokens (the snapshot "
                          "carries only output tokens) or its position cannot be proven"
                        : "tokens not available: no live request in the snapshot owns this block "
                          "(a prefill device's hold while the KV is sent)";
  return out;
}

}  // namespace tokenfab::ui
