#include "core/tokenizer/special_tokens.h"

namespace tokenfab {

int32_t SpecialTokenMatcher::child(int32_t node, uint8_t byte) const {
  for (int32_t c = nodes_[node].first_child; c >= 0; c = nodes_[c].next_sibling) {
    if (nodes_[c].byte == byte) return c;
  }
  return -1;
}

void SpecialTokenMatcher::add(std::string_view text, TokenId id, bool needs_parse_special) {
  int32_t node = -1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<uint8_t>(text[i]);
    int32_t next = i == 0 ? root_children_[byte] : child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.push_back({-1, -1, byte, false, -1});
      if (i == 0) {
        root_children_[byte] = next;
      } else {
        nodes_[next].next_sibling = nodes_[node].first_child;
        nodes_[node].first_child = next;
      }
    }
    node = next;
  }
  if (nodes_[node].id < 0) {
    nodes_[node].id = id;
    nodes_[node].needs_parse_special = needs_parse_special;
  }
}

SpecialTokenMatcher::Match SpecialTokenMatcher::match_from_first_byte(std::string_view text,
                                                                      bool parse_special) const {
  Match best;
  int32_t node = root_children_[static_cast<uint8_t>(text[0])];
  for (std::size_t i = 1; node >= 0; ++i) {
    const Node& n = nodes_[node];
    if (n.id >= 0 && (parse_special || !n.needs_parse_special)) best = {n.id, i};
    if (i == text.size()) break;
    node = child(node, static_cast<uint8_t>(text[i]));
  }
  return best;
}

}  // namespace tokenfab
