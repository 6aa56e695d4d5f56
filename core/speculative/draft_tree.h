#pragma once
// Static draft trees: every node of level d − 1 gets level d's tokens as children.

#include <cstdint>
#include <span>
#include <vector>

#include "core/kvcache/block_pool.h"  // TokenId

namespace tokenfab {

// The most nodes a draft tree verifies in one step (GenerationRequest::kMaxTreeNodes).
inline constexpr int32_t kMaxDraftTreeNodes = 64;

// A static draft tree from each level's tokens (level d: head d's top tokens): every node of level
// d − 1 gets level d's tokens as children, breadth first, at most max_nodes nodes. parent[i]: the
// node draft[i] follows (−1: the last token).
void build_draft_tree(std::span<const std::vector<TokenId>> level_tokens,
                      std::vector<TokenId>& draft, std::vector<int32_t>& parent,
                      int32_t max_nodes = kMaxDraftTreeNodes);

}  // namespace tokenfab
