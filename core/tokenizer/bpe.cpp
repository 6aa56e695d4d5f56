#include "core/tokenizer/bpe.h"

#include <algorithm>

namespace tokenfab {

namespace {

constexpr TokenId kDead = -2;

// std::*_heap build a max-heap; "greater" puts the lowest (rank, left) on top.
bool later(const BpeMerges::Scratch::Candidate& a, const BpeMerges::Scratch::Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
}

}  // namespace

void BpeMerges::add(TokenId left, TokenId right, TokenId merged, int32_t rank) {
  merges_.try_emplace(key(left, right), Merge{rank, merged});
}

void BpeMerges::push_candidate(Scratch& scratch, int32_t left) const {
  if (left < 0) return;
  const int32_t right = scratch.symbols[left].next;
  if (right < 0) return;
  const TokenId a = scratch.symbols[left].id;
  const TokenId b = scratch.symbols[right].id;
  const auto it = merges_.find(key(a, b));
  if (it == merges_.end()) return;
  scratch.heap.push_back({it->second.rank, left, a, b, it->second.merged});
  std::push_heap(scratch.heap.begin(), scratch.heap.end(), later);
}

void BpeMerges::apply(std::vector<TokenId>& ids, Scratch& scratch) const {
  if (ids.size() < 2) return;
  const auto n = static_cast<int32_t>(ids.size());
  scratch.symbols.resize(ids.size());
  scratch.heap.clear();
  for (int32_t i = 0; i < n; ++i) {
    scratch.symbols[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1};
  }
  for (int32_t i = 0; i + 1 < n; ++i) push_candidate(scratch, i);

  while (!scratch.heap.empty()) {
    std::pop_heap(scratch.heap.begin(), scratch.heap.end(), later);
    const Scratch::Candidate c = scratch.heap.back();
    scratch.heap.pop_back();
    // A candidate is stale when either symbol has merged since it was pushed.
    Scratch::Symbol& left = scratch.symbols[c.left];
    if (left.id != c.left_id || left.next < 0) continue;
    Scratch::Symbol& right = scratch.symbols[left.next];
    if (right.id != c.right_id) continue;

    left.id = c.merged;
    right.id = kDead;
    left.next = right.next;
    if (right.next >= 0) scratch.symbols[right.next].prev = c.left;
    push_candidate(scratch, left.prev);
    push_candidate(scratch, c.left);
  }

  ids.clear();
  for (int32_t i = 0; i >= 0; i = scratch.symbols[i].next) ids.push_back(scratch.symbols[i].id);
}

}  // namespace tokenfab
