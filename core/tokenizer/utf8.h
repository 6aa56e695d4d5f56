#pragma once
// UTF-8 decoding that never fails: the tokenizer takes any bytes, and the detokenizer must tell a
// sequence that is merely incomplete (more bytes may come) from one that can never be valid.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tokenfab::utf8 {

enum class Status : uint8_t {
  kValid,       // `length` bytes form the code point `cp`
  kInvalid,     // the first `length` bytes (the maximal subpart, >= 1) can never start a character
  kIncomplete,  // all remaining bytes (`length`) are a valid prefix of a longer character
};

struct Step {
  Status status;
  uint32_t cp;  // meaningful when kValid
  uint32_t length;
};

// Decodes the character at the start of `bytes` (non-empty). Strict UTF-8: no overlong forms, no
// surrogates, nothing above U+10FFFF.
Step decode(std::string_view bytes);

// Appends the UTF-8 encoding of `cp` (must be a Unicode scalar value).
void append(std::string& out, uint32_t cp);

inline constexpr uint32_t kReplacement = 0xFFFD;

// Appends `bytes` with every invalid maximal subpart, and an incomplete tail, replaced by U+FFFD.
void append_sanitized(std::string& out, std::string_view bytes);

// Length of the longest prefix of `bytes` that does not end inside an incomplete character.
std::size_t complete_prefix_length(std::string_view bytes);

bool is_valid(std::string_view bytes);

}  // namespace tokenfab::utf8
