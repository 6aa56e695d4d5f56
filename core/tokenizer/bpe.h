#pragma once
// BPE merging over token ids: a word starts as one symbol per byte and adjacent pairs merge,
// lowest merge rank first (leftmost first among equal ranks), until no listed pair is left.
// A heap of candidate pairs over a linked list of symbols keeps a word of n bytes O(n log n).

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tokenfab {

using TokenId = int32_t;

class BpeMerges {
 public:
  // `rank` is the merge's index in the vocabulary's merge list (lower merges first). A pair
  // already present keeps its lower rank.
  void add(TokenId left, TokenId right, TokenId merged, int32_t rank);
  std::size_t size() const { return merges_.size(); }

  // Reusable buffers, so that encoding many words allocates little.
  struct Scratch {
    struct Symbol {
      TokenId id;    // kDead once merged into its left neighbour
      int32_t prev;  // index of the previous live symbol, -1 at the start
      int32_t next;  // index of the next live symbol, -1 at the end
    };
    struct Candidate {
      int32_t rank;
      int32_t left;  // index of the left symbol; ties on rank go to the leftmost
      TokenId left_id;
      TokenId right_id;
      TokenId merged;
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Merges `ids` (one id per byte, in order) in place.
  void apply(std::vector<TokenId>& ids, Scratch& scratch) const;

 private:
  struct Merge {
    int32_t rank;
    TokenId merged;
  };
  static uint64_t key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  void push_candidate(Scratch& scratch, int32_t left) const;

  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace tokenfab
