#include "core/tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cctype>

#include "core/common/error.h"
#include "core/tokenizer/jinja_string.h"
#include "core/tokenizer/utf8.h"

namespace tokenfab::jinja {

namespace {

constexpr std::string_view kOperators2[] = {"//", "**", "==", "!=", ">=", "<="};
constexpr std::string_view kOperators1 = "+-*/%~[](){}<>=.:|,;";

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Python's str.rstrip() of the text before a "{%-" tag.
void rstrip_whitespace(std::string& text) {
  text = pystr::strip(text, std::nullopt, false, true);
}

// The length of the whitespace (str.isspace) at the start of `text`.
size_t leading_whitespace(std::string_view text) {
  const std::vector<uint32_t> cps = pystr::code_points(text);
  size_t n = 0;
  while (n < cps.size() && pystr::is_space(cps[n])) ++n;
  return pystr::from_code_points(cps, 0, n).size();
}

class Lexer {
 public:
  explicit Lexer(const SourceText& source) : source_(source), text_(source.text) {}

  std::vector<Token> run() {
    while (pos_ < text_.size()) {
      const size_t tag = find_tag(pos_);
      if (tag == std::string_view::npos) {
        push_text(std::string(text_.substr(pos_)));
        break;
      }
      open_tag(tag);
    }
    tokens_.push_back({TokenKind::End, "", static_cast<uint32_t>(text_.size())});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(size_t offset, const std::string& what) const {
    throw Error(source_.position(static_cast<uint32_t>(offset)) + ": " + what);
  }

  size_t find_tag(size_t from) const {
    for (size_t at = text_.find('{', from); at != std::string_view::npos;
         at = text_.find('{', at + 1)) {
      if (at + 1 < text_.size() &&
          (text_[at + 1] == '{' || text_[at + 1] == '%' || text_[at + 1] == '#'))
        return at;
    }
    return std::string_view::npos;
  }

  void push_text(std::string text) {
    if (!text.empty())
      tokens_.push_back({TokenKind::Text, std::move(text), static_cast<uint32_t>(pos_)});
  }

  // The data before the tag at `tag` (whitespace control applied), then the tag itself.
  void open_tag(size_t tag) {
    const char type = text_[tag + 1];
    const char sign = tag + 2 < text_.size() ? text_[tag + 2] : '\0';
    std::string data(text_.substr(pos_, tag - pos_));
    if (sign == '-') {
      rstrip_whitespace(data);
    } else if (sign != '+' && type != '{') {           // lstrip_blocks
      const size_t line_begin = data.rfind('\n') + 1;  // 0 when there is none
      const bool only_blanks =
          std::all_of(data.begin() + static_cast<std::ptrdiff_t>(line_begin), data.end(),
                      [](char c) { return c == ' ' || c == '\t'; });
      if ((line_begin > 0 || line_starting_) && only_blanks) data.resize(line_begin);
    }
    push_text(std::move(data));
    pos_ = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
    if (type == '%' && lex_raw(tag)) return;
    if (type == '#') {
      skip_comment(tag);
    } else {
      lex_tag(tag, type == '{');
    }
  }

  // "{% raw %}...{% endraw %}": the text between is data, tags and all.
  bool lex_raw(size_t tag) {
    static constexpr std::string_view kBlanks = " \t\n\r\f\v";
    const size_t word = text_.find_first_not_of(kBlanks, pos_);
    if (word == std::string_view::npos || text_.compare(word, 3, "raw") != 0) return false;
    size_t end = text_.find_first_not_of(kBlanks, word + 3);
    const bool strip_after = end != std::string_view::npos && text_.compare(end, 3, "-%}") == 0;
    if (end == std::string_view::npos || (!strip_after && text_.compare(end, 2, "%}") != 0)) {
      return false;
    }
    pos_ = end + (strip_after ? 3 : 2);
    if (strip_after) pos_ += leading_whitespace(text_.substr(pos_));
    for (size_t at = text_.find("{%", pos_); at != std::string_view::npos;
         at = text_.find("{%", at + 2)) {
      size_t p = at + 2;
      const char sign = p < text_.size() ? text_[p] : '\0';
      if (sign == '-' || sign == '+') ++p;
      p = text_.find_first_not_of(kBlanks, p);
      if (p == std::string_view::npos || text_.compare(p, 6, "endraw") != 0) continue;
      p = text_.find_first_not_of(kBlanks, p + 6);
      if (p == std::string_view::npos) break;
      const char close = text_[p];
      const bool signed_close =
          (close == '-' || close == '+') && text_.compare(p + 1, 2, "%}") == 0;
      if (!signed_close && text_.compare(p, 2, "%}") != 0) continue;
      std::string data(text_.substr(pos_, at - pos_));
      if (sign == '-') rstrip_whitespace(data);
      push_text(std::move(data));
      pos_ = p + (signed_close ? 3 : 2);
      close_tag(signed_close ? close : '\0', true);
      return true;
    }
    fail(tag, "the raw block is not closed ('{% endraw %}' missing)");
  }

  void skip_comment(size_t tag) {
    const size_t body = pos_;
    const size_t close = text_.find("#}", body);
    if (close == std::string_view::npos) fail(tag, "the comment is not closed ('#}' missing)");
    const char sign = close > body ? text_[close - 1] : '\0';
    pos_ = close + 2;
    close_tag(sign == '-' || sign == '+' ? sign : '\0', true);
  }

  // After a closing delimiter: "-" strips the whitespace that follows, plain block and comment
  // ends drop one newline (trim_blocks), "+" keeps everything.
  void close_tag(char sign, bool trims_newline) {
    const size_t start = pos_;
    if (sign == '-') {
      pos_ += leading_whitespace(text_.substr(pos_));
    } else if (sign != '+' && trims_newline && pos_ < text_.size() && text_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > start && text_[pos_ - 1] == '\n';
  }

  void lex_tag(size_t tag, bool variable) {
    tokens_.push_back(
        {variable ? TokenKind::VarBegin : TokenKind::BlockBegin, "", static_cast<uint32_t>(tag)});
    const char close = variable ? '}' : '%';
    std::vector<char> brackets;  // open brackets: the tag cannot end inside them
    while (true) {
      while (pos_ < text_.size() && is_blank(text_[pos_])) ++pos_;
      if (pos_ >= text_.size()) {
        fail(tag, std::string("the tag is not closed ('") + close + "}' missing)");
      }
      if (brackets.empty() && try_close(close, variable)) return;
      lex_token(brackets);
    }
  }

  bool try_close(char close, bool variable) {
    const std::string_view rest = text_.substr(pos_);
    const std::string end = std::string(1, close) + "}";
    char sign = '\0';
    if ((rest.starts_with("-") || (!variable && rest.starts_with("+"))) &&
        rest.substr(1).starts_with(end)) {
      sign = rest[0];
    } else if (!rest.starts_with(end)) {
      return false;
    }
    tokens_.push_back(
        {variable ? TokenKind::VarEnd : TokenKind::BlockEnd, "", static_cast<uint32_t>(pos_)});
    pos_ += end.size() + (sign ? 1 : 0);
    close_tag(sign, !variable);
    return true;
  }

  void lex_token(std::vector<char>& brackets) {
    const char c = text_[pos_];
    if (is_digit(c)) return lex_number();
    if (is_name_start(c)) {
      const size_t start = pos_;
      while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
      tokens_.push_back({TokenKind::Name, std::string(text_.substr(start, pos_ - start)),
                         static_cast<uint32_t>(start)});
      return;
    }
    if (c == '\'' || c == '"') return lex_string();
    lex_operator(brackets);
  }

  void lex_operator(std::vector<char>& brackets) {
    const size_t start = pos_;
    std::string op;
    for (std::string_view two : kOperators2) {
      if (text_.substr(pos_).starts_with(two)) op = two;
    }
    if (op.empty() && kOperators1.find(text_[pos_]) != std::string_view::npos) op = text_[pos_];
    if (op.empty()) fail(start, "unexpected character '" + std::string(1, text_[pos_]) + "'");
    pos_ += op.size();
    const char c = op[0];
    if (op.size() == 1 && (c == '(' || c == '[' || c == '{')) brackets.push_back(c);
    if (op.size() == 1 && (c == ')' || c == ']' || c == '}')) {
      const char want = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (brackets.empty() || brackets.back() != want) fail(start, "unexpected '" + op + "'");
      brackets.pop_back();
    }
    tokens_.push_back({TokenKind::Operator, op, static_cast<uint32_t>(start)});
  }

  // Digits with single "_" between them, from pos_; returns the digits without underscores.
  std::string digit_run() {
    std::string digits;
    while (pos_ < text_.size()) {
      if (is_digit(text_[pos_])) {
        digits += text_[pos_++];
      } else if (text_[pos_] == '_' && !digits.empty() && pos_ + 1 < text_.size() &&
                 is_digit(text_[pos_ + 1])) {
        ++pos_;
      } else {
        break;
      }
    }
    return digits;
  }

  void lex_number();
  void lex_string();
  void append_escape(std::string& value, size_t start);
  uint32_t escape_code_point(size_t start, size_t digits, int base);

  const SourceText& source_;
  std::string_view text_;
  size_t pos_ = 0;
  bool line_starting_ = true;  // the last thing consumed ended a line (for lstrip_blocks)
  std::vector<Token> tokens_;
};

void Lexer::lex_number() {
  const size_t start = pos_;
  Token token{TokenKind::Int, "", static_cast<uint32_t>(start)};
  std::string text = digit_run();
  bool is_float = false;
  // As in jinja2, no float right after ".": "x.0.1" is x[0][1].
  const bool after_dot =
      !tokens_.empty() && tokens_.back().kind == TokenKind::Operator && tokens_.back().value == ".";
  if (!after_dot && pos_ + 1 < text_.size() && text_[pos_] == '.' && is_digit(text_[pos_ + 1])) {
    ++pos_;
    text += "." + digit_run();
    is_float = true;
  }
  if (!after_dot && pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    size_t look = pos_ + 1;
    if (look < text_.size() && (text_[look] == '+' || text_[look] == '-')) ++look;
    if (look < text_.size() && is_digit(text_[look])) {
      text += "e" + std::string(text_.substr(pos_ + 1, look - pos_ - 1));
      pos_ = look;
      text += digit_run();
      is_float = true;
    }
  }
  token.value = text;
  if (is_float) {
    token.kind = TokenKind::Float;
    token.float_value = pystr::parse_float(text).value_or(0.0);
  } else {
    const auto v = pystr::parse_int(text, 10);
    if (!v) fail(start, "integer literal " + text + " is out of range");
    token.int_value = *v;
  }
  tokens_.push_back(std::move(token));
}

uint32_t Lexer::escape_code_point(size_t start, size_t digits, int base) {
  if (pos_ + digits > text_.size()) fail(start, "truncated escape in string literal");
  const auto v = pystr::parse_int(text_.substr(pos_, digits), base);
  if (!v || text_[pos_] == '+' || text_[pos_] == '-' || *v > 0x10FFFF) {
    fail(start, "invalid escape in string literal");
  }
  pos_ += digits;
  return *v >= 0xD800 && *v <= 0xDFFF ? utf8::kReplacement : static_cast<uint32_t>(*v);
}

// Python's unicode-escape rules, as jinja2 decodes literals. Literals may span lines.
void Lexer::lex_string() {
  const size_t start = pos_;
  const char quote = text_[pos_++];
  std::string value;
  while (true) {
    if (pos_ >= text_.size()) fail(start, "the string literal is not closed");
    const char c = text_[pos_++];
    if (c == quote) break;
    if (c == '\\') {
      append_escape(value, start);
    } else {
      value += c;
    }
  }
  tokens_.push_back({TokenKind::String, std::move(value), static_cast<uint32_t>(start)});
}

// The escape after a backslash (pos_ is past the backslash). Unknown escapes stay as written.
void Lexer::append_escape(std::string& value, size_t start) {
  static constexpr std::string_view kFrom = "\\'\"abfnrtv";
  static constexpr std::string_view kTo = "\\'\"\a\b\f\n\r\t\v";
  if (pos_ >= text_.size()) fail(start, "the string literal is not closed");
  const char e = text_[pos_++];
  if (e == '\n') return;  // a backslash at the end of a line joins the lines
  if (const size_t i = kFrom.find(e); i != std::string_view::npos) {
    value += kTo[i];
  } else if (e == 'x' || e == 'u' || e == 'U') {
    utf8::append(value, escape_code_point(start, e == 'x' ? 2 : e == 'u' ? 4 : 8, 16));
  } else if (e >= '0' && e <= '7') {
    --pos_;
    size_t n = 1;
    while (n < 3 && pos_ + n < text_.size() && text_[pos_ + n] >= '0' && text_[pos_ + n] <= '7')
      ++n;
    utf8::append(value, escape_code_point(start, n, 8));
  } else {
    value += '\\';
    value += e;
  }
}

}  // namespace

SourceText SourceText::normalize(std::string_view raw, std::string name) {
  SourceText source{std::move(name), {}};
  source.text.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '\r') {
      source.text += raw[i];
    } else {
      source.text += '\n';
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    }
  }
  if (!source.text.empty() && source.text.back() == '\n') source.text.pop_back();
  return source;
}

namespace {

std::pair<int64_t, size_t> line_and_column(const std::string& text, uint32_t offset) {
  const size_t at = std::min<size_t>(offset, text.size());
  const size_t line_start = at == 0 ? 0 : text.rfind('\n', at - 1) + 1;
  const auto line =
      1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
  const size_t column =
      1 + pystr::length(std::string_view(text).substr(line_start, at - line_start));
  return {line, column};
}

}  // namespace

std::string SourceText::position(uint32_t offset) const {
  const auto [line, column] = line_and_column(text, offset);
  return name + ":" + std::to_string(line) + ":" + std::to_string(column);
}

std::string SourceText::line_column(uint32_t offset) const {
  const auto [line, column] = line_and_column(text, offset);
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

std::vector<Token> tokenize(const SourceText& source) {
  return Lexer(source).run();
}

}  // namespace tokenfab::jinja
