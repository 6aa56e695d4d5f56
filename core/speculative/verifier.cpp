#include "core/speculative/verifier.h"

#include <algorithm>

namespace tokenfab {

int32_t draft_depth(int32_t n_draft, std::span<const int32_t> tree_parent) {
  if (tree_parent.empty()) return n_draft;
  std::vector<int32_t> depth(tree_parent.size(), 0);
  int32_t deepest = 0;
  for (size_t r = 1; r < depth.size(); ++r)
    deepest = std::max(deepest, depth[r] = depth[static_cast<size_t>(tree_parent[r])] + 1);
  return deepest;
}

void count_acceptance(int32_t depth, int32_t accepted, std::vector<int64_t>& proposed_at,
                      std::vector<int64_t>& accepted_at) {
  proposed_at.resize(std::max(proposed_at.size(), static_cast<size_t>(depth)));
  accepted_at.resize(proposed_at.size());
  for (int32_t p = 0; p < depth; ++p) {
    ++proposed_at[static_cast<size_t>(p)];
    if (p < accepted) ++accepted_at[static_cast<size_t>(p)];
  }
}

}  // namespace tokenfab
