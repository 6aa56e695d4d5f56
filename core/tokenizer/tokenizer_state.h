#pragma once
// The inside of a Tokenizer, shared by tokenizer.cpp (encode / decode) and tokenizer_load.cpp
// (building it from a vocabulary). Immutable once built, so one Tokenizer serves every thread.

#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tokenizer/bpe.h"
#include "core/tokenizer/pre_tokenizer.h"
#include "core/tokenizer/tokenizer.h"

namespace tokenfab {

struct SpecialToken {
  std::string_view text;  // points into TokenizerData::texts
  TokenId id;
  bool needs_parse_special;  // control tokens; user-defined ones are always matched
};

// Tokenizer::State is private to Tokenizer; helpers in the .cpp files work on this base.
struct TokenizerData {
  std::string source;
  std::string pre_name;
  PreTokenizer pre = PreTokenizer::kGpt2;
  // Llama 3 (llama-bpe) takes a pre-token that is a whole vocab entry as one token before merging.
  bool ignore_merges = false;

  std::vector<std::string> texts;                     // (n_vocab) vocab entries as stored
  std::vector<std::string> bytes;                     // (n_vocab) what each token decodes to
  std::vector<TokenType> types;                       // (n_vocab)
  std::unordered_map<std::string_view, TokenId> ids;  // text -> id; keys point into `texts`
  BpeMerges merges;
  std::array<TokenId, 256> byte_ids{};  // the single-byte token of each byte, or -1
  // Sorted by text length, longest first, so the first match at a position is the longest.
  std::vector<SpecialToken> specials;
  std::array<bool, 256> special_first_byte{};

  TokenId bos = -1;
  TokenId eos = -1;
  bool add_bos = false;
  std::vector<TokenId> end_of_generation;  // sorted

  TokenId find(std::string_view text) const {
    const auto it = ids.find(text);
    return it == ids.end() ? -1 : it->second;
  }
};

struct Tokenizer::State : TokenizerData {};

}  // namespace tokenfab
