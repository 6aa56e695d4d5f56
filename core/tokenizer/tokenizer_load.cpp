// Building a Tokenizer: reading `tokenizer.ggml.*` from a GGUF file and checking the vocabulary.

#include <algorithm>
#include <limits>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/gguf/gguf_reader.h"
#include "core/tokenizer/byte_level.h"
#include "core/tokenizer/tokenizer_state.h"

namespace tokenfab {

namespace {

constexpr const char* kSupportedModels = "gpt2, llama";

// Chat and document terminators that end generation when the vocabulary has them as special
// tokens (ChatML, Llama 3, GPT-2 / StarCoder, Gemma, Phi-3).
constexpr const char* kEndOfGenerationTexts[] = {
    "<|im_end|>",      "<|eot_id|>",    "<|eom_id|>", "<|endoftext|>",
    "<|end_of_text|>", "<end_of_turn>", "<|end|>",
};

VocabModel vocab_model(const std::string& source, const std::string& model) {
  if (model == "gpt2") return VocabModel::kByteLevelBpe;
  if (model == "llama") return VocabModel::kSentencePiece;
  throw Error(source + ": tokenizer.ggml.model: unsupported tokenizer model " + model +
              " (supported: " + kSupportedModels + ")");
}

// The byte-level pre-tokenizer `pre` names; a SentencePiece vocabulary has none ("default").
PreTokenizer pre_tokenizer_of(const TokenizerVocab& v, VocabModel model) {
  if (model == VocabModel::kSentencePiece) {
    if (v.pre != "default") {
      throw Error(v.source + ": tokenizer.ggml.pre: unsupported pre-tokenizer " + v.pre +
                  " for tokenizer model " + v.model + " (supported: default)");
    }
    return PreTokenizer::kGpt2;  // unused
  }
  const std::optional<PreTokenizer> pre = pre_tokenizer_from_name(v.pre);
  if (!pre) {
    throw Error(v.source + ": tokenizer.ggml.pre: unsupported pre-tokenizer " + v.pre +
                " for tokenizer model " + v.model +
                " (supported: " + supported_pre_tokenizer_names() + ")");
  }
  return *pre;
}

std::string where(const gguf::GgufFile& file, std::string_view key) {
  return file.name() + ": " + std::string(key);
}

TokenId optional_id(const gguf::GgufFile& file, std::string_view key) {
  const gguf::Value* value = file.find(key);
  if (value == nullptr) return -1;
  const int64_t id = value->as_int(where(file, key));
  if (id < 0 || id > std::numeric_limits<TokenId>::max()) {
    throw Error(where(file, key) + ": token id " + std::to_string(id) + " is out of range");
  }
  return static_cast<TokenId>(id);
}

TokenType to_token_type(int32_t raw) {
  return (raw >= 1 && raw <= 6) ? static_cast<TokenType>(raw) : TokenType::kNormal;
}

bool is_special_type(TokenType type) {
  return type == TokenType::kControl || type == TokenType::kUserDefined;
}

void check_id(const TokenizerVocab& v, TokenId id, const char* key) {
  if (id >= static_cast<TokenId>(v.tokens.size())) {
    throw Error(v.source + ": " + key + " = " + std::to_string(id) +
                " is outside the vocabulary (" + std::to_string(v.tokens.size()) + " tokens)");
  }
}

void load_tokens(const TokenizerVocab& v, TokenizerData& s) {
  const std::size_t n = v.tokens.size();
  s.texts = v.tokens;
  s.types.resize(n, TokenType::kNormal);
  for (std::size_t i = 0; i < v.token_types.size(); ++i)
    s.types[i] = to_token_type(v.token_types[i]);
  s.bytes.resize(n);
  s.ids.reserve(n);
  for (std::size_t i = 0; i < n; ++i) s.ids.emplace(s.texts[i], static_cast<TokenId>(i));
}

// gpt2: every token but the special ones is written in the byte-level alphabet.
void load_byte_level_bytes(const TokenizerVocab& v, TokenizerData& s) {
  std::size_t unmapped = 0;
  for (std::size_t i = 0; i < s.texts.size(); ++i) {
    const TokenType type = s.types[i];
    if (is_special_type(type) || type == TokenType::kUnknown) {
      s.bytes[i] = s.texts[i];  // stored as plain text, not byte-mapped
    } else if (!byte_level::text_to_bytes(s.texts[i], s.bytes[i])) {
      ++unmapped;
    }
  }
  if (unmapped > 0) {
    logger("tokenizer")
        ->warn("{}: {} tokens hold characters outside the byte-level mapping", v.source, unmapped);
  }
  // Vocabularies may lack bytes that never occur in their training text (SmolLM2 lacks 21, among
  // them C0, C1 and F5..FF, which no valid UTF-8 holds). Like HF tokenizers and llama.cpp, the
  // encoder drops such bytes.
  int missing_bytes = 0;
  for (int b = 0; b < 256; ++b) {
    s.byte_ids[b] = s.find(byte_level::byte_to_text(static_cast<uint8_t>(b)));
    missing_bytes += s.byte_ids[b] < 0;
  }
  if (missing_bytes > 0) {
    logger("tokenizer")
        ->debug("{}: {} of 256 bytes have no token; encoding drops them", v.source, missing_bytes);
  }
}

// llama: "▁" is a space, `<0xNN>` byte tokens are bytes, control and unknown tokens plain text.
void load_sentencepiece(const TokenizerVocab& v, TokenizerData& s) {
  if (v.scores.size() != v.tokens.size()) {
    throw Error(v.source + ": tokenizer.ggml.scores has " + std::to_string(v.scores.size()) +
                " entries, expected one per token (" + std::to_string(v.tokens.size()) + ")");
  }
  s.byte_ids.fill(-1);
  for (std::size_t i = 0; i < s.texts.size(); ++i) {
    const TokenType type = s.types[i];
    if (type == TokenType::kControl || type == TokenType::kUnknown) {
      s.bytes[i] = s.texts[i];
    } else if (!sentencepiece_token_bytes(s.texts[i], type, s.bytes[i])) {
      throw Error(v.source + ": tokenizer.ggml.tokens[" + std::to_string(i) + "] = \"" +
                  s.texts[i] + "\" is a byte token (token_type 6) but not of the form <0xNN>");
    } else if (type == TokenType::kByte) {
      s.byte_ids[static_cast<uint8_t>(s.bytes[i][0])] = static_cast<TokenId>(i);
    }
  }
  const auto missing_bytes = std::count(s.byte_ids.begin(), s.byte_ids.end(), -1);
  if (missing_bytes > 0) {
    logger("tokenizer")
        ->debug(
            "{}: {} of 256 bytes have no <0xNN> token; a character without a token of its own "
            "that holds one of them is encoded as the unknown token",
            v.source, missing_bytes);
  }
  s.sentencepiece = SentencePieceBpe(s.texts, v.scores, s.types, s.byte_ids, v.unk);
}

void load_merges(const TokenizerVocab& v, TokenizerData& s) {
  std::size_t skipped = 0;
  std::string merged;
  for (std::size_t rank = 0; rank < v.merges.size(); ++rank) {
    const std::string& m = v.merges[rank];
    const std::size_t space = m.find(' ', 1);
    if (space == std::string::npos || space + 1 >= m.size()) {
      throw Error(v.source + ": tokenizer.ggml.merges[" + std::to_string(rank) +
                  "] is not \"left right\": \"" + m + "\"");
    }
    const std::string_view left(m.data(), space);
    const std::string_view right(m.data() + space + 1, m.size() - space - 1);
    merged.assign(left).append(right);
    const TokenId a = s.find(left), b = s.find(right), ab = s.find(merged);
    if (a < 0 || b < 0 || ab < 0) {
      ++skipped;
      continue;
    }
    s.merges.add(a, b, ab, static_cast<int32_t>(rank));
  }
  if (skipped > 0) {
    logger("tokenizer")
        ->warn("{}: {} merges name tokens outside the vocabulary; ignored", v.source, skipped);
  }
}

void load_specials(TokenizerData& s) {
  for (std::size_t i = 0; i < s.texts.size(); ++i) {
    if (!is_special_type(s.types[i]) || s.texts[i].empty()) continue;
    s.specials.add(s.texts[i], static_cast<TokenId>(i), s.types[i] == TokenType::kControl);
  }
}

void load_end_of_generation(const TokenizerVocab& v, TokenizerData& s) {
  for (TokenId id : {v.eos, v.eot, v.eom}) {
    if (id >= 0) s.end_of_generation.push_back(id);
  }
  for (const char* text : kEndOfGenerationTexts) {
    const TokenId id = s.find(text);
    if (id >= 0 && is_special_type(s.types[id])) s.end_of_generation.push_back(id);
  }
  std::sort(s.end_of_generation.begin(), s.end_of_generation.end());
  s.end_of_generation.erase(std::unique(s.end_of_generation.begin(), s.end_of_generation.end()),
                            s.end_of_generation.end());
}

}  // namespace

Tokenizer Tokenizer::from_vocab(const TokenizerVocab& v) {
  const VocabModel model = vocab_model(v.source, v.model);
  const PreTokenizer pre = pre_tokenizer_of(v, model);
  if (v.tokens.empty()) throw Error(v.source + ": tokenizer.ggml.tokens is empty");
  if (v.tokens.size() > static_cast<std::size_t>(std::numeric_limits<TokenId>::max())) {
    throw Error(v.source + ": tokenizer.ggml.tokens has too many entries");
  }
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size()) {
    throw Error(v.source + ": tokenizer.ggml.token_type has " +
                std::to_string(v.token_types.size()) + " entries, expected one per token (" +
                std::to_string(v.tokens.size()) + ")");
  }
  check_id(v, v.bos, "tokenizer.ggml.bos_token_id");
  check_id(v, v.eos, "tokenizer.ggml.eos_token_id");
  check_id(v, v.eot, "tokenizer.ggml.eot_token_id");
  check_id(v, v.eom, "tokenizer.ggml.eom_token_id");
  check_id(v, v.unk, "tokenizer.ggml.unknown_token_id");

  auto s = std::make_unique<State>();
  s->source = v.source;
  s->model_name = v.model;
  s->model = model;
  s->pre_name = v.pre;
  s->pre = pre;
  s->ignore_merges = pre == PreTokenizer::kLlama3 || pre == PreTokenizer::kTekken;
  s->bos = v.bos;
  s->eos = v.eos;
  s->add_bos = v.add_bos;
  load_tokens(v, *s);
  if (model == VocabModel::kByteLevelBpe) {
    load_byte_level_bytes(v, *s);
    load_merges(v, *s);
  } else {
    s->add_space_prefix = v.add_space_prefix.value_or(true);
    load_sentencepiece(v, *s);
  }
  load_specials(*s);
  load_end_of_generation(v, *s);
  logger("tokenizer")
      ->debug("{}: {} model, {} tokens, {} merges, pre-tokenizer {}", v.source, s->model_name,
              s->texts.size(), s->merges.size(), s->pre_name);
  return Tokenizer(std::move(s));
}

Tokenizer Tokenizer::from_gguf(const gguf::GgufFile& file) {
  TokenizerVocab v;
  v.source = file.name();
  v.model = file.get("tokenizer.ggml.model").as_string(where(file, "tokenizer.ggml.model"));
  const VocabModel model = vocab_model(v.source, v.model);  // before the keys other models lack
  if (const gguf::Value* pre = file.find("tokenizer.ggml.pre")) {
    v.pre = pre->as_string(where(file, "tokenizer.ggml.pre"));
  }
  v.tokens =
      file.get("tokenizer.ggml.tokens").as_string_array(where(file, "tokenizer.ggml.tokens"));
  if (const gguf::Value* types = file.find("tokenizer.ggml.token_type")) {
    for (int64_t t : types->as_int_array(where(file, "tokenizer.ggml.token_type"))) {
      v.token_types.push_back(static_cast<int32_t>(std::clamp<int64_t>(t, -1, 255)));
    }
  }
  if (model == VocabModel::kByteLevelBpe) {
    v.merges =
        file.get("tokenizer.ggml.merges").as_string_array(where(file, "tokenizer.ggml.merges"));
  } else {
    const std::vector<double> scores =
        file.get("tokenizer.ggml.scores").as_float_array(where(file, "tokenizer.ggml.scores"));
    v.scores.assign(scores.begin(), scores.end());
    if (const gguf::Value* prefix = file.find("tokenizer.ggml.add_space_prefix")) {
      v.add_space_prefix = prefix->as_bool(where(file, "tokenizer.ggml.add_space_prefix"));
    }
  }
  v.bos = optional_id(file, "tokenizer.ggml.bos_token_id");
  v.eos = optional_id(file, "tokenizer.ggml.eos_token_id");
  v.eot = optional_id(file, "tokenizer.ggml.eot_token_id");
  v.eom = optional_id(file, "tokenizer.ggml.eom_token_id");
  v.unk = optional_id(file, "tokenizer.ggml.unknown_token_id");
  if (const gguf::Value* add_bos = file.find("tokenizer.ggml.add_bos_token")) {
    v.add_bos = add_bos->as_bool(where(file, "tokenizer.ggml.add_bos_token"));
  }
  return from_vocab(v);
}

}  // namespace tokenfab
