// Encoding and decoding. The vocabulary is loaded in tokenizer_load.cpp.

#include "core/tokenizer/tokenizer.h"

#include <algorithm>

#include "core/common/error.h"
#include "core/tokenizer/byte_level.h"
#include "core/tokenizer/tokenizer_state.h"
#include "core/tokenizer/utf8.h"

namespace tokenfab {

namespace {

// Encodes text that holds no special token, pre-token by pre-token. Pre-tokens repeat a lot
// ("the", " ", ","), so each distinct one is merged once per encode() call.
class WordEncoder {
 public:
  WordEncoder(const TokenizerData& s, std::vector<TokenId>& out) : s_(s), out_(out) {}

  void encode(std::string_view text) {
    if (text.empty()) return;
    for (std::string_view word : pre_tokenize(text, s_.pre)) encode_word(word);
  }

 private:
  void encode_word(std::string_view word) {
    auto [it, inserted] = cache_.try_emplace(word);
    std::vector<TokenId>& ids = it->second;
    if (inserted) merge_word(word, ids);
    out_.insert(out_.end(), ids.begin(), ids.end());
  }

  void merge_word(std::string_view word, std::vector<TokenId>& ids) {
    if (s_.ignore_merges) {
      mapped_.clear();
      for (char c : word) mapped_ += byte_level::byte_to_text(static_cast<uint8_t>(c));
      if (const TokenId id = s_.find(mapped_); id >= 0) {
        ids.push_back(id);
        return;
      }
    }
    ids.reserve(word.size());
    for (char c : word) {
      const TokenId id = s_.byte_ids[static_cast<uint8_t>(c)];
      if (id >= 0) ids.push_back(id);  // a byte the vocabulary lacks is dropped
    }
    s_.merges.apply(ids, scratch_);
  }

  const TokenizerData& s_;
  std::vector<TokenId>& out_;
  std::unordered_map<std::string_view, std::vector<TokenId>> cache_;
  BpeMerges::Scratch scratch_;
  std::string mapped_;
};

// Encodes text that holds no special token with the SentencePiece model: spaces become "▁", and
// with add_space_prefix one more opens the text (every text between special tokens, as llama.cpp
// and HF tokenizers' Prepend normalizer do).
class SentencePieceEncoder {
 public:
  SentencePieceEncoder(const TokenizerData& s, std::vector<TokenId>& out) : s_(s), out_(out) {}

  void encode(std::string_view text) {
    if (text.empty()) return;
    escaped_.clear();
    escape_spaces(text, s_.add_space_prefix, escaped_);
    s_.sentencepiece.encode(escaped_, s_.ids, out_, scratch_);
  }

 private:
  const TokenizerData& s_;
  std::vector<TokenId>& out_;
  std::string escaped_;
  SentencePieceBpe::Scratch scratch_;
};

void check_token_id(const TokenizerData& s, TokenId id) {
  if (id < 0 || static_cast<std::size_t>(id) >= s.texts.size()) {
    throw Error(s.source + ": token id " + std::to_string(id) + " is outside the vocabulary (" +
                std::to_string(s.texts.size()) + " tokens)");
  }
}

// Special tokens split the text; leftmost match first, the longest at a position. `encoder`
// encodes the text between them.
template <typename Encoder>
void encode_with_specials(const TokenizerData& s, std::string_view text, bool parse_special,
                          std::vector<TokenId>& out) {
  Encoder encoder(s, out);
  std::size_t start = 0;  // first byte not yet encoded
  std::size_t pos = 0;
  while (pos < text.size()) {
    const SpecialTokenMatcher::Match special = s.specials.match(text.substr(pos), parse_special);
    if (special.length == 0) {
      ++pos;
      continue;
    }
    encoder.encode(text.substr(start, pos - start));
    out.push_back(special.id);
    pos += special.length;
    start = pos;
  }
  encoder.encode(text.substr(start));
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<State> state) : state_(std::move(state)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  const State& s = *state_;
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && s.bos >= 0) out.push_back(s.bos);
  if (s.model == VocabModel::kSentencePiece) {
    encode_with_specials<SentencePieceEncoder>(s, text, parse_special, out);
  } else {
    encode_with_specials<WordEncoder>(s, text, parse_special, out);
  }
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool render_special) const {
  std::string out;
  for (TokenId id : ids) out += piece(id, render_special);
  if (state_->add_space_prefix && out.starts_with(' ')) out.erase(0, 1);
  return out;
}

std::string_view Tokenizer::piece(TokenId id, bool render_special) const {
  const std::string& bytes = token_bytes(id);
  switch (state_->types[id]) {
    case TokenType::kNormal:
    case TokenType::kByte:
    case TokenType::kUserDefined:
      return bytes;
    case TokenType::kControl:
    case TokenType::kUnknown:
    case TokenType::kUnused:
      break;
  }
  return render_special ? std::string_view(bytes) : std::string_view();
}

const std::string& Tokenizer::token_bytes(TokenId id) const {
  check_token_id(*state_, id);
  return state_->bytes[id];
}

const std::string& Tokenizer::token_text(TokenId id) const {
  check_token_id(*state_, id);
  return state_->texts[id];
}

TokenType Tokenizer::token_type(TokenId id) const {
  check_token_id(*state_, id);
  return state_->types[id];
}

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(state_->texts.size()); }
TokenId Tokenizer::bos_id() const { return state_->bos; }
TokenId Tokenizer::eos_id() const { return state_->eos; }
bool Tokenizer::add_bos_token() const { return state_->add_bos; }
const std::string& Tokenizer::model() const { return state_->model_name; }
const std::string& Tokenizer::pre_tokenizer() const { return state_->pre_name; }
bool Tokenizer::add_space_prefix() const { return state_->add_space_prefix; }
TokenId Tokenizer::find_token(std::string_view text) const { return state_->find(text); }

bool Tokenizer::is_special(TokenId id) const {
  const TokenType type = token_type(id);
  return type == TokenType::kControl || type == TokenType::kUserDefined;
}

bool Tokenizer::is_end_of_generation(TokenId id) const {
  const auto& eog = state_->end_of_generation;
  return std::binary_search(eog.begin(), eog.end(), id);
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool render_special)
    : tokenizer_(tokenizer), render_special_(render_special) {}

std::string IncrementalDetokenizer::push(TokenId id) {
  pending_ += tokenizer_.piece(id, render_special_);
  // Hold back a trailing incomplete character; bytes that can never become valid are replaced
  // now, so every piece handed out is valid UTF-8 on its own.
  const std::size_t complete = utf8::complete_prefix_length(pending_);
  std::string out;
  utf8::append_sanitized(out, std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  utf8::append_sanitized(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace tokenfab
