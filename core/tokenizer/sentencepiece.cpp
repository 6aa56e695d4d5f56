#include "core/tokenizer/sentencepiece.h"

#include <algorithm>

#include "core/tokenizer/utf8.h"

namespace tokenfab {

namespace {

// std::*_heap build a max-heap; "later" puts the highest (score, -left) on top.
bool later(const SentencePieceBpe::Scratch::Candidate& a,
           const SentencePieceBpe::Scratch::Candidate& b) {
  return a.score != b.score ? a.score < b.score : a.left > b.left;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

SentencePieceBpe::SentencePieceBpe(std::span<const std::string> texts,
                                   std::span<const float> scores, std::span<const TokenType> types,
                                   const std::array<TokenId, 256>& byte_ids, TokenId unk)
    : scores_(scores.begin(), scores.end()), byte_ids_(byte_ids), unk_(unk) {
  is_piece_.resize(texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    is_piece_[i] = types[i] == TokenType::kNormal || types[i] == TokenType::kUserDefined;
    if (is_piece_[i]) max_piece_bytes_ = std::max(max_piece_bytes_, texts[i].size());
  }
}

TokenId SentencePieceBpe::piece(std::string_view text, const TokenIndex& index) const {
  if (text.size() > max_piece_bytes_) return -1;
  const auto it = index.find(text);
  return (it != index.end() && is_piece_[it->second]) ? it->second : -1;
}

void SentencePieceBpe::push_candidate(std::string_view text, const TokenIndex& index,
                                      Scratch& scratch, int32_t left) const {
  if (left < 0) return;
  const Scratch::Symbol& a = scratch.symbols[left];
  if (a.next < 0) return;
  const Scratch::Symbol& b = scratch.symbols[a.next];
  const TokenId merged = piece(text.substr(a.begin, a.length + b.length), index);
  if (merged < 0) return;
  scratch.heap.push_back({scores_[merged], left, a.length, b.length, merged});
  std::push_heap(scratch.heap.begin(), scratch.heap.end(), later);
}

void SentencePieceBpe::append_fallback(std::string_view bytes, std::vector<TokenId>& out,
                                       bool& after_unk) const {
  const bool all_bytes = std::all_of(
      bytes.begin(), bytes.end(), [&](char c) { return byte_ids_[static_cast<uint8_t>(c)] >= 0; });
  if (all_bytes) {
    for (char c : bytes) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
    after_unk = false;
  } else if (unk_ >= 0 && !after_unk) {
    out.push_back(unk_);
    after_unk = true;
  }
}

void SentencePieceBpe::encode(std::string_view text, const TokenIndex& index,
                              std::vector<TokenId>& out, Scratch& scratch) const {
  if (text.empty()) return;
  scratch.symbols.clear();
  scratch.heap.clear();
  for (std::size_t i = 0; i < text.size();) {
    const utf8::Step step = utf8::decode(text.substr(i));
    const uint32_t length = step.status == utf8::Status::kValid ? step.length : 1;
    const auto n = static_cast<int32_t>(scratch.symbols.size());
    scratch.symbols.push_back(
        {static_cast<uint32_t>(i), length, n - 1, n + 1, piece(text.substr(i, length), index)});
    i += length;
  }
  scratch.symbols.back().next = -1;
  const auto n = static_cast<int32_t>(scratch.symbols.size());
  for (int32_t i = 0; i + 1 < n; ++i) push_candidate(text, index, scratch, i);

  while (!scratch.heap.empty()) {
    std::pop_heap(scratch.heap.begin(), scratch.heap.end(), later);
    const Scratch::Candidate c = scratch.heap.back();
    scratch.heap.pop_back();
    // A candidate is stale when either symbol has grown (or gone) since it was pushed.
    Scratch::Symbol& left = scratch.symbols[c.left];
    if (left.length != c.left_length || left.next < 0) continue;
    Scratch::Symbol& right = scratch.symbols[left.next];
    if (right.length != c.right_length) continue;

    left.length += right.length;
    left.id = c.merged;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) scratch.symbols[right.next].prev = c.left;
    push_candidate(text, index, scratch, left.prev);
    push_candidate(text, index, scratch, c.left);
  }

  bool after_unk = false;
  for (int32_t i = 0; i >= 0; i = scratch.symbols[i].next) {
    const Scratch::Symbol& s = scratch.symbols[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      after_unk = false;
    } else {
      append_fallback(text.substr(s.begin, s.length), out, after_unk);
    }
  }
}

void escape_spaces(std::string_view text, bool prefix_space, std::string& out) {
  if (prefix_space) out += kSentencePieceSpace;
  std::size_t start = 0;
  for (std::size_t space = text.find(' '); space != std::string_view::npos;
       space = text.find(' ', start)) {
    out.append(text.substr(start, space - start)).append(kSentencePieceSpace);
    start = space + 1;
  }
  out.append(text.substr(start));
}

bool sentencepiece_token_bytes(std::string_view text, TokenType type, std::string& out) {
  if (type == TokenType::kByte) {
    const bool well_formed = text.size() == 6 && text.starts_with("<0x") && text[5] == '>' &&
                             hex_digit(text[3]) >= 0 && hex_digit(text[4]) >= 0;
    if (!well_formed) return false;
    out += static_cast<char>(hex_digit(text[3]) * 16 + hex_digit(text[4]));
    return true;
  }
  std::size_t start = 0;
  for (std::size_t mark = text.find(kSentencePieceSpace); mark != std::string_view::npos;
       mark = text.find(kSentencePieceSpace, start)) {
    out.append(text.substr(start, mark - start)).push_back(' ');
    start = mark + kSentencePieceSpace.size();
  }
  out.append(text.substr(start));
  return true;
}

}  // namespace tokenfab
