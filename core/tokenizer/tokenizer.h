#pragma once
// Tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata. Two models
// (`tokenizer.ggml.model`):
//   gpt2   byte-level BPE (SmolLM2, Llama 3, Qwen 2/3, Mistral Nemo), split first by the
//          pre-tokenizer `tokenizer.ggml.pre` names (pre_tokenizer.h), merged by merge rank
//          (bpe.h);
//   llama  SentencePiece BPE (Llama 2, Mistral 7B, Phi-3, Gemma): merged by token score with byte
//          fallback (sentencepiece.h); no pre-tokenizer (`pre` = default), "▁" stands for a space.
// Control tokens are matched whole in the input when `parse_special` is set, user-defined ones
// always; the text between them is encoded by the model.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tokenfab::gguf {
class GgufFile;
}

namespace tokenfab {

using TokenId = int32_t;

// Token types of `tokenizer.ggml.token_type` (llama.cpp's numbering).
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special: matched in text only with parse_special, rendered on request
  kUserDefined = 4,  // special: always matched in text as a whole, always rendered as its text
  kUnused = 5,
  kByte = 6,
};

// What a tokenizer is built from: the `tokenizer.ggml.*` metadata, already read. from_gguf()
// fills one from a file; tests build small ones by hand.
struct TokenizerVocab {
  std::string source = "vocab";  // names the origin (the file) in error messages
  std::string model = "gpt2";    // tokenizer.ggml.model
  std::string pre = "default";   // tokenizer.ggml.pre
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // empty: every token is kNormal
  std::vector<std::string> merges;   // gpt2: "left right", highest priority first
  std::vector<float> scores;         // llama: one per token, higher merges first
  // llama: a "▁" opens the text and every text after a special token. Absent: true (llama.cpp's
  // default for SentencePiece vocabularies).
  std::optional<bool> add_space_prefix;
  TokenId bos = -1;
  TokenId eos = -1;
  TokenId eot = -1;  // tokenizer.ggml.eot_token_id
  TokenId eom = -1;  // tokenizer.ggml.eom_token_id
  // gpt2: checked, not used (like HF tokenizers, bytes without a token are dropped). llama: stands
  // for a character with neither a token nor byte tokens.
  TokenId unk = -1;
  bool add_bos = false;
};

class Tokenizer {
 public:
  // Throws Error naming the file and key when the metadata is missing or of an unsupported kind.
  static Tokenizer from_gguf(const gguf::GgufFile& file);
  // Throws Error naming `vocab.source` and the field when the vocabulary is unusable or of an
  // unsupported kind.
  static Tokenizer from_vocab(const TokenizerVocab& vocab);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text (any bytes; invalid UTF-8 is encoded byte by byte) to ids. `add_bos` prepends BOS;
  // callers pass the model's `add_bos_token()` for raw prompts. gpt2: a byte the vocabulary has no
  // token for is dropped (SmolLM2 lacks 21 bytes, e.g. 0x04 and 0xFF), as HF tokenizers does.
  // llama: a character without a token is encoded as its `<0xNN>` byte tokens.
  std::vector<TokenId> encode(std::string_view text, bool add_bos, bool parse_special) const;
  // Ids (a text from its start) to bytes. Special tokens are rendered as their text when
  // `render_special`. With add_space_prefix, the space the encoder put before the text is dropped:
  // one leading space of the result, as HF tokenizers and llama.cpp do.
  std::string decode(std::span<const TokenId> ids, bool render_special = true) const;
  // The bytes one token stands for (gpt2: byte-level decoding of its vocab entry; llama: the entry
  // with "▁" as a space, or the byte of a `<0xNN>` token).
  const std::string& token_bytes(TokenId id) const;
  const std::string& token_text(TokenId id) const;  // the vocab entry as stored
  // The bytes decode() emits for one token: token_bytes(id), or nothing for a control token when
  // not `render_special`. Throws Error for an id outside [0, n_vocab).
  std::string_view piece(TokenId id, bool render_special) const;
  TokenType token_type(TokenId id) const;

  int32_t n_vocab() const;
  TokenId bos_id() const;  // -1 when the model has none
  TokenId eos_id() const;
  bool add_bos_token() const;
  bool is_special(TokenId id) const;
  // End of generation: EOS, and chat terminators such as <|im_end|> / <|eot_id|>.
  bool is_end_of_generation(TokenId id) const;
  // Id of a token given its exact vocab text, or -1.
  TokenId find_token(std::string_view text) const;
  const std::string& model() const;  // tokenizer.ggml.model: "gpt2" or "llama"
  const std::string& pre_tokenizer() const;
  bool add_space_prefix() const;

 private:
  struct State;
  explicit Tokenizer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Turns a stream of ids into text without ever emitting a broken UTF-8 sequence: bytes of an
// incomplete character are held back until the character completes (or flush() is called); a
// character may span several tokens (byte-level pieces, `<0xNN>` byte tokens). The stream is taken
// to continue a text (generated tokens after a prompt), so unlike decode() it keeps a leading
// space.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool render_special = false);
  std::string push(TokenId id);  // text that became complete with this token (may be empty)
  std::string flush();           // whatever is held back, invalid bytes replaced by U+FFFD

 private:
  const Tokenizer& tokenizer_;
  bool render_special_;
  std::string pending_;
};

}  // namespace tokenfab
