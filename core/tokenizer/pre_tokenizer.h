#pragma once
// Pre-tokenizers: split text into the pieces ("words") BPE merges within. Each is a hand-written
// matcher for one regex, with Unicode classes from unicode_tables.h (std::regex is neither fast
// enough nor Unicode-aware):
//   kGpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kSmolLM  every \p{N} character on its own, then kGpt2 within the text between them
//   kLlama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2   kLlama3 with one number character at a time: \p{N} in place of \p{N}{1,3}
//   kTekken  [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|
//            [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|
//            \p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//            (Mistral Nemo's tokenizer.json; llama.cpp's `tekken`)
// Bytes that are not valid UTF-8 count as characters of their own, of class "other".

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tokenfab {

enum class PreTokenizer { kGpt2, kSmolLM, kLlama3, kQwen2, kTekken };

// The value of `tokenizer.ggml.pre` for each kind (byte-level BPE vocabularies): "default" /
// "gpt-2", "smollm", "llama-bpe", "qwen2" / "deepseek-r1-qwen", "tekken".
std::optional<PreTokenizer> pre_tokenizer_from_name(std::string_view name);
// Those names, comma-separated, for error messages.
std::string supported_pre_tokenizer_names();

// Pieces of `text` in order; they are views into `text` and concatenate to exactly `text`.
std::vector<std::string_view> pre_tokenize(std::string_view text, PreTokenizer kind);

}  // namespace tokenfab
