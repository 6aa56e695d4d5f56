#pragma once
// Splits a Jinja template into tokens, applying whitespace control the way jinja2 does with HF's
// settings (trim_blocks and lstrip_blocks on, keep_trailing_newline off): "\r\n" and "\r" read
// as "\n"; one trailing newline of the template is dropped; a newline right after a block or
// comment tag is removed; spaces and tabs before a block or comment tag that starts a line are
// removed; "-" beside a delimiter strips all whitespace on that side, "+" keeps it.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tokenfab::jinja {

enum class TokenKind : uint8_t {
  Text,        // template data between tags
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,  // value: the literal's text with escapes resolved
  Int,
  Float,
  Operator,  // value: the operator's text ("+", "//", "==", "(", ...)
  End,       // end of the template
};

struct Token {
  TokenKind kind;
  std::string value;
  uint32_t offset;  // byte offset of the token in the normalized source
  int64_t int_value = 0;
  double float_value = 0;
};

// The template text as the lexer reads it: newlines normalized, one trailing newline dropped.
// Token offsets index into it; `position` turns one into "line L, column C" for messages.
struct SourceText {
  std::string name;  // names the template in messages ("model.gguf: tokenizer.chat_template")
  std::string text;

  static SourceText normalize(std::string_view raw, std::string name);
  // "NAME:LINE:COLUMN" (1-based; columns count code points).
  std::string position(uint32_t offset) const;
  // "line LINE, column COLUMN", for a second position in one message.
  std::string line_column(uint32_t offset) const;
};

// Throws tokenfab::Error "NAME:LINE:COLUMN: what" on an unterminated tag, comment or string, or
// a character no token starts with.
std::vector<Token> tokenize(const SourceText& source);

}  // namespace tokenfab::jinja
