#pragma once
// The verifier: what a verification step emits for one request, from the target's judgement of
// each logits row of its chunk. Row 0 is the request's last token; rows 1… are its drafts. A
// chain's drafts follow each other (draft j sits at row 1 + j and is judged by row j); a tree's
// node c follows node tree_parent[c] (−1… the root is row 0) and is judged by its parent's row.
//
// Chain (speculative sampling): drafts are accepted in order while the target accepts them; the
// first rejected one is replaced by the target's own token for that row (sampled from the
// residual distribution), else after the last draft the target adds its own token. Tree
// (greedy): from the root, follow the child whose token the target chooses while there is one,
// then the target's own token. Either way the result is the accepted drafts and one token, and
// `path` the rows of the accepted drafts — every emitted token k was chosen from row
// logits_row(k, path).
//
// The judge is called in the order the target's sampler draws: row by row along the path, so a
// seeded sampler gives the same tokens as before the verifier was its own file.

#include <cstdint>
#include <span>
#include <vector>

#include "core/kvcache/block_pool.h"  // TokenId

namespace tokenfab {

struct Verdict {
  std::vector<TokenId> tokens;  // accepted drafts, then the target's token
  std::vector<int32_t> path;    // the accepted drafts' rows (1…), one fewer than tokens
};

// The target's side of one request's rows. Judge must provide:
//   bool accept(int64_t row, TokenId draft)      — the target keeps `draft` after `row`;
//   TokenId rejected(int64_t row, TokenId draft) — its token for `row` after rejecting `draft`;
//   TokenId choose(int64_t row)                  — its own token for `row`.
template <typename Judge>
Verdict verify_chain(std::span<const TokenId> drafts, Judge& judge) {
  Verdict v;
  const auto n_draft = static_cast<int32_t>(drafts.size());
  int32_t j = 0;
  for (; j < n_draft; ++j) {
    const TokenId draft = drafts[static_cast<size_t>(j)];
    if (!judge.accept(j, draft)) {
      v.tokens.push_back(judge.rejected(j, draft));
      break;
    }
    v.tokens.push_back(draft);
    v.path.push_back(1 + j);
  }
  if (j == n_draft) v.tokens.push_back(judge.choose(j));
  return v;
}

// `row_tokens[r]`: the token at row r (row 0 the last token); tree_parent[r] the row it follows.
template <typename Judge>
Verdict verify_tree(std::span<const int32_t> tree_parent, std::span<const TokenId> row_tokens,
                    Judge& judge) {
  Verdict v;
  const auto n_rows = static_cast<int32_t>(row_tokens.size());
  int32_t at = 0;
  for (bool found = true; found;) {
    found = false;
    for (int32_t c = at + 1; c < n_rows && !found; ++c) {
      if (tree_parent[static_cast<size_t>(c)] != at) continue;
      const TokenId token = row_tokens[static_cast<size_t>(c)];
      if (judge.accept(at, token)) {
        v.tokens.push_back(token);
        v.path.push_back(c);
        at = c;
        found = true;
      }
    }
  }
  v.tokens.push_back(judge.choose(at));
  return v;
}

// The row whose logits chose emitted token k of a verdict with accepted-draft rows `path`.
inline int64_t logits_row(size_t k, std::span<const int32_t> path) {
  return k == 0 ? 0 : path[k - 1];
}

// The depth a draft reaches: a chain's length, or a tree's deepest node (tree_parent over its
// rows, row 0 the root). Positions 0 … depth − 1 were proposed.
int32_t draft_depth(int32_t n_draft, std::span<const int32_t> tree_parent);

// Per-position acceptance of one verification: positions < depth were proposed, those < accepted
// (the verdict's path length) accepted. Adds them into the counts, growing them as needed.
void count_acceptance(int32_t depth, int32_t accepted, std::vector<int64_t>& proposed_at,
                      std::vector<int64_t>& accepted_at);

}  // namespace tokenfab
