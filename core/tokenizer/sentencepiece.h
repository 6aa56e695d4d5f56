#pragma once
// SentencePiece BPE (`tokenizer.ggml.model` = llama: Llama 2, Mistral 7B, Phi-3, Gemma): merging
// by token score. A text, its spaces already written as "▁" (U+2581), starts as one symbol per
// UTF-8 character (an invalid byte is a symbol of its own). The adjacent pair whose concatenation
// is a piece with the highest score merges first, the leftmost among equal scores, until no
// adjacent concatenation is a piece. A symbol left that is no piece (a character the vocabulary
// lacks) becomes the `<0xNN>` tokens of its bytes, or the unknown token when one of those is
// missing (one unknown token for a run of such symbols).
//
// Pieces are the normal and user-defined tokens; control, unknown, unused and byte tokens are
// never produced by merging. A heap of candidate pairs over a linked list of symbols keeps a text
// of n characters O(n log n).

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tokenizer/tokenizer.h"

namespace tokenfab {

// Text of a token -> its id; keys point into the vocabulary's token texts.
using TokenIndex = std::unordered_map<std::string_view, TokenId>;

class SentencePieceBpe {
 public:
  SentencePieceBpe() = default;
  // `scores` and `types` have one entry per token; `byte_ids` is the `<0xNN>` token of each byte,
  // or -1; `unk` may be -1.
  SentencePieceBpe(std::span<const std::string> texts, std::span<const float> scores,
                   std::span<const TokenType> types, const std::array<TokenId, 256>& byte_ids,
                   TokenId unk);

  // Reusable buffers, so that encoding many texts allocates little.
  struct Scratch {
    struct Symbol {
      uint32_t begin;   // byte offset in the text
      uint32_t length;  // bytes; 0 once merged into its left neighbour
      int32_t prev;     // index of the previous live symbol, -1 at the start
      int32_t next;     // index of the next live symbol, -1 at the end
      TokenId id;       // the piece it is, or -1 (a character the vocabulary lacks)
    };
    struct Candidate {
      float score;
      int32_t left;  // index of the left symbol; ties on score go to the leftmost
      uint32_t left_length;
      uint32_t right_length;
      TokenId merged;
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Appends the ids of `text` (spaces already "▁") to `out`. `index` is the vocabulary's.
  void encode(std::string_view text, const TokenIndex& index, std::vector<TokenId>& out,
              Scratch& scratch) const;

 private:
  TokenId piece(std::string_view text, const TokenIndex& index) const;
  void push_candidate(std::string_view text, const TokenIndex& index, Scratch& scratch,
                      int32_t left) const;
  void append_fallback(std::string_view bytes, std::vector<TokenId>& out, bool& after_unk) const;

  std::vector<float> scores_;      // (n_vocab)
  std::vector<uint8_t> is_piece_;  // (n_vocab) 1 for normal and user-defined tokens
  std::size_t max_piece_bytes_ = 0;
  std::array<TokenId, 256> byte_ids_{};
  TokenId unk_ = -1;
};

// The "▁" that stands for a space in SentencePiece vocabularies.
inline constexpr std::string_view kSentencePieceSpace = "\xe2\x96\x81";

// `text` with every space written as "▁", after a "▁" when `prefix_space`; appended to `out`.
void escape_spaces(std::string_view text, bool prefix_space, std::string& out);

// The bytes a SentencePiece token stands for: its text with "▁" as a space, or for a byte token
// (type kByte, text `<0xNN>`) the one byte. Returns false for a byte token whose text is not of
// that form.
bool sentencepiece_token_bytes(std::string_view text, TokenType type, std::string& out);

}  // namespace tokenfab
