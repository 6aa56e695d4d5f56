#include "core/speculative/context_lookup.h"

#include <algorithm>

namespace tokenfab {

std::vector<TokenId> lookup_continuation(std::span<const TokenId> context, int32_t max_ngram,
                                         int32_t length) {
  const auto n_ctx = static_cast<int64_t>(context.size());
  for (int64_t n = std::min<int64_t>(max_ngram, n_ctx - 1); n >= 1; --n) {
    const std::span<const TokenId> suffix = context.last(static_cast<size_t>(n));
    // Occurrences [s, s + n) with s + n < n_ctx, the latest first.
    for (int64_t s = n_ctx - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + s)) continue;
      const int64_t from = s + n;
      const int64_t count = std::min<int64_t>(length, n_ctx - from);
      return {context.begin() + from, context.begin() + from + count};
    }
  }
  return {};
}

int32_t merge_draft_branch(std::vector<TokenId>& draft, std::vector<int32_t>& parent,
                           std::span<const TokenId> branch, int32_t max_nodes) {
  const bool chain = parent.empty();
  // Walk the shared prefix: node −1 is the root.
  int32_t node = -1;
  size_t depth = 0;
  for (; depth < branch.size(); ++depth) {
    int32_t child = -1;
    if (chain) {
      const auto at = static_cast<int32_t>(depth);  // a chain's node at depth d + 1 is node d
      if (at < static_cast<int32_t>(draft.size()) &&
          draft[static_cast<size_t>(at)] == branch[depth])
        child = at;
    } else {
      for (size_t i = 0; i < draft.size(); ++i)
        if (parent[i] == node && draft[i] == branch[depth]) {
          child = static_cast<int32_t>(i);
          break;
        }
    }
    if (child < 0) break;
    node = child;
  }
  if (depth == branch.size()) return 0;
  const auto room = std::max<int64_t>(0, max_nodes - static_cast<int64_t>(draft.size()));
  const auto n_new = static_cast<int32_t>(std::min<int64_t>(room, branch.size() - depth));
  if (n_new == 0) return 0;
  // A chain that the branch only extends (it ends where the branch leaves it) stays a chain.
  if (chain && node == static_cast<int32_t>(draft.size()) - 1) {
    draft.insert(draft.end(), branch.begin() + static_cast<std::ptrdiff_t>(depth),
                 branch.begin() + static_cast<std::ptrdiff_t>(depth) + n_new);
    return n_new;
  }
  if (chain)
    for (size_t i = 0; i < draft.size(); ++i) parent.push_back(static_cast<int32_t>(i) - 1);
  for (int32_t j = 0; j < n_new; ++j) {
    parent.push_back(node);
    node = static_cast<int32_t>(draft.size());
    draft.push_back(branch[depth + static_cast<size_t>(j)]);
  }
  return n_new;
}

}  // namespace tokenfab
