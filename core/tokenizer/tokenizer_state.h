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
#include "core/tokenizer/sentencepiece.h"
#include "core/tokenizer/special_tokens.h"
#include "core/tokenizer/tokenizer.h"

namespace tokenfab {

enum class VocabModel { kByteLevelBpe, kSentencePiece };  // tokenizer.ggml.model gpt2 / llama

// Tokenizer::State is private to Tokenizer; helpers in the .cpp files work on this base.
struct TokenizerData {
  std::string source;
  std::string model_name;
  VocabModel model = VocabModel::kByteLevelBpe;
  std::string pre_name;
  PreTokenizer pre = PreTokenizer::kGpt2;  // kByteLevelBpe only
  // Llama 3 (llama-bpe) and Tekken take a pre-token that is a whole vocab entry as one token before
  // merging.
  bool ignore_merges = false;
  // kSentencePiece: a "▁" opens the text and every text after a special token.
  bool add_space_prefix = false;

  std::vector<std::string> texts;  // (n_vocab) vocab entries as stored
  std::vector<std::string> bytes;  // (n_vocab) what each token decodes to
  std::vector<TokenType> types;    // (n_vocab)
  TokenIndex ids;                  // text -> id; keys point into `texts`
  BpeMerges merges;                // kByteLevelBpe
  SentencePieceBpe sentencepiece;  // kSentencePiece
  // The single-byte token of each byte (the byte-level character, or `<0xNN>`), or -1.
  std::array<TokenId, 256> byte_ids{};
  SpecialTokenMatcher specials;  // control and user-defined tokens

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
