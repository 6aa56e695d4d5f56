#pragma once
// Context lookup drafts: text repeats itself — code its identifiers and lines, documents their
// phrases, a small model its own loops — so the tokens that followed an earlier occurrence of the
// context's last few tokens are often the next ones. They cost no model work to propose, and
// they complement a draft head, which predicts from the hidden state and cannot copy from the
// context: the worker adds them to a head's proposal as one more branch of the draft tree (or
// drafts them alone, without a head). Verification is the usual one, so outputs are unchanged.

#include <cstdint>
#include <span>
#include <vector>

#include "core/kvcache/block_pool.h"  // TokenId

namespace tokenfab {

// The most recent earlier occurrence of the context's last n tokens, for the largest n in
// [1, max_ngram] that has one (an occurrence may overlap the suffix, but must end before it),
// and up to `length` tokens that followed it there. Empty when no suffix recurs, or for a
// context shorter than two tokens. max_ngram and length ≥ 1.
std::vector<TokenId> lookup_continuation(std::span<const TokenId> context, int32_t max_ngram,
                                         int32_t length);

// Adds the path `branch` (its first token a child of the root, i.e. of the last token) to the
// draft tree: draft[i] is node i's token and parent[i] its parent node (−1 for the root); an
// empty `parent` with a non-empty draft is a chain. The longest prefix of `branch` already in
// the tree is shared; the rest becomes new nodes appended at the end (each after its parent), at
// most until the tree holds max_nodes nodes. A chain stays a chain (parent empty) when the branch
// only extends it or is a prefix of it. Returns the number of nodes added.
int32_t merge_draft_branch(std::vector<TokenId>& draft, std::vector<int32_t>& parent,
                           std::span<const TokenId> branch, int32_t max_nodes);

}  // namespace tokenfab
