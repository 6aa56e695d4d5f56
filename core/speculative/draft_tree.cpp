#include "core/speculative/draft_tree.h"

namespace tokenfab {

void build_draft_tree(std::span<const std::vector<TokenId>> level_tokens,
                      std::vector<TokenId>& draft, std::vector<int32_t>& parent,
                      int32_t max_nodes) {
  std::vector<int32_t> previous = {-1};  // nodes of the level above (−1: the last token)
  for (const std::vector<TokenId>& tokens : level_tokens) {
    std::vector<int32_t> level;
    for (const int32_t p : previous) {
      for (const TokenId token : tokens) {
        if (static_cast<int32_t>(draft.size()) == max_nodes) return;
        level.push_back(static_cast<int32_t>(draft.size()));
        draft.push_back(token);
        parent.push_back(p);
      }
    }
    previous = std::move(level);
  }
}

}  // namespace tokenfab
