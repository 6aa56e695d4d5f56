#pragma once
// Special tokens (control and user-defined) matched whole in the text, in a byte trie of their
// texts: finding the longest one at a position costs about the length of the match, whatever the
// number of special tokens (Gemma 3 has 6,414, most of them starting with '<').

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/tokenizer/tokenizer.h"

namespace tokenfab {

class SpecialTokenMatcher {
 public:
  SpecialTokenMatcher() { root_children_.fill(-1); }

  // `needs_parse_special`: a control token, matched only when encode() is asked to. A text added
  // twice keeps its first id. `text` must not be empty.
  void add(std::string_view text, TokenId id, bool needs_parse_special);

  struct Match {
    TokenId id = -1;
    std::size_t length = 0;  // bytes; 0: no special token starts the text
  };
  // The longest special token that starts `text` (control ones only when `parse_special`).
  // Called at every byte of a text: the common miss is decided here, inline.
  Match match(std::string_view text, bool parse_special) const {
    if (text.empty() || root_children_[static_cast<uint8_t>(text[0])] < 0) return {};
    return match_from_first_byte(text, parse_special);
  }

 private:
  Match match_from_first_byte(std::string_view text, bool parse_special) const;
  struct Node {
    int32_t first_child = -1;
    int32_t next_sibling = -1;
    uint8_t byte = 0;
    bool needs_parse_special = false;
    TokenId id = -1;  // the special token whose text ends here, or -1
  };
  int32_t child(int32_t node, uint8_t byte) const;

  std::vector<Node> nodes_;                 // tries below the first byte
  std::array<int32_t, 256> root_children_;  // node of each first byte, or -1
};

}  // namespace tokenfab
