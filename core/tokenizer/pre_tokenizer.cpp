#include "core/tokenizer/pre_tokenizer.h"

#include <cstdint>

#include "core/tokenizer/unicode_tables.h"
#include "core/tokenizer/utf8.h"

namespace tokenfab {

namespace {

using unicode::CodepointClass;

// One character of the input: a code point, or (for an invalid UTF-8 byte) a value above
// U+10FFFF that matches no class.
struct Char {
  uint32_t cp;
  uint32_t offset;  // byte offset in the text
  CodepointClass cls;
  uint8_t case_sets;  // kUpperSet | kLowerSet bits; only filled for the patterns that use them
};

// The two character sets of the Tekken pattern: "upper" [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and
// "lower" [\p{Ll}\p{Lm}\p{Lo}\p{M}]. Lm, Lo and marks are in both.
constexpr uint8_t kUpperSet = 1;
constexpr uint8_t kLowerSet = 2;

uint8_t case_sets(uint32_t cp) {
  switch (unicode::letter_category(cp)) {
    case unicode::LetterCategory::kLu:
    case unicode::LetterCategory::kLt:
      return kUpperSet;
    case unicode::LetterCategory::kLl:
      return kLowerSet;
    case unicode::LetterCategory::kLm:
    case unicode::LetterCategory::kLo:
    case unicode::LetterCategory::kMark:
      return kUpperSet | kLowerSet;
    case unicode::LetterCategory::kNone:
      break;
  }
  return 0;
}

constexpr uint32_t kInvalidByteBase = 0x110000;

std::vector<Char> decode_chars(std::string_view text) {
  std::vector<Char> chars;
  chars.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const utf8::Step step = utf8::decode(text.substr(i));
    const auto offset = static_cast<uint32_t>(i);
    if (step.status == utf8::Status::kValid) {
      chars.push_back({step.cp, offset, unicode::classify(step.cp), 0});
      i += step.length;
    } else {
      const uint32_t byte = static_cast<uint8_t>(text[i]);
      chars.push_back({kInvalidByteBase + byte, offset, CodepointClass::kOther, 0});
      i += 1;
    }
  }
  return chars;
}

bool is_newline(const Char& c) { return c.cp == '\r' || c.cp == '\n'; }

uint32_t ascii_lower(uint32_t cp) { return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp; }

// Length (2 or 3) of a contraction 's 't 're 've 'm 'll 'd at c[0], or 0.
std::size_t contraction_length(const Char* c, std::size_t n, bool ignore_case) {
  if (n < 2 || c[0].cp != '\'') return 0;
  auto at = [&](std::size_t i) { return ignore_case ? ascii_lower(c[i].cp) : c[i].cp; };
  const uint32_t a = at(1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (n < 3) return 0;
  const uint32_t b = at(2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

std::size_t run_of(const Char* c, std::size_t n, std::size_t from, CodepointClass cls) {
  std::size_t k = from;
  while (k < n && c[k].cls == cls) ++k;
  return k;
}

// \s+(?!\S)|\s+ at a whitespace character: a run followed by a non-space gives its last
// whitespace character to the next piece (so " word" keeps its space), unless the run is one long.
std::size_t whitespace_run_length(const Char* c, std::size_t n) {
  const std::size_t k = run_of(c, n, 0, CodepointClass::kWhitespace);
  return (k < n && k > 1) ? k - 1 : k;
}

// Length (>= 1) of the GPT-2 pattern's match at c[0]; `n` counts the characters left.
std::size_t match_gpt2(const Char* c, std::size_t n) {
  if (std::size_t len = contraction_length(c, n, false)) return len;
  // ' ?\p{L}+', ' ?\p{N}+' and ' ?[^\s\p{L}\p{N}]+' are each a run of one non-space class.
  const std::size_t j = (c[0].cp == ' ' && n > 1) ? 1 : 0;
  if (c[j].cls != CodepointClass::kWhitespace) return run_of(c, n, j, c[j].cls);
  return whitespace_run_length(c, n);
}

// [^\r\n\p{L}\p{N}]: the character that may lead a word in the Llama 3 and Tekken patterns.
bool can_lead_word(const Char& c) {
  return !is_newline(c) && c.cls != CodepointClass::kLetter && c.cls != CodepointClass::kNumber;
}

// ' ?[^\s\p{L}\p{N}]+' followed by any run of the characters `trailing` accepts, or 0.
template <typename Trailing>
std::size_t match_symbols(const Char* c, std::size_t n, Trailing trailing) {
  const std::size_t j = (c[0].cp == ' ' && n > 1) ? 1 : 0;
  if (c[j].cls != CodepointClass::kOther) return 0;
  std::size_t k = run_of(c, n, j, CodepointClass::kOther);
  while (k < n && trailing(c[k])) ++k;
  return k;
}

// \s*[\r\n]+|\s+(?!\S)|\s+ at a whitespace character.
std::size_t match_spaces(const Char* c, std::size_t n) {
  // \s*[\r\n]+ : up to and including the last newline of the whitespace run.
  const std::size_t run = run_of(c, n, 0, CodepointClass::kWhitespace);
  for (std::size_t k = run; k > 0; --k) {
    if (is_newline(c[k - 1])) return k;
  }
  return whitespace_run_length(c, n);
}

// Length (>= 1) of the Llama 3 pattern's match at c[0], numbers taken up to `max_digits` at a time
// (3 for Llama 3, 1 for Qwen 2).
template <std::size_t max_digits>
std::size_t match_llama3(const Char* c, std::size_t n) {
  if (std::size_t len = contraction_length(c, n, true)) return len;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c[0].cls == CodepointClass::kLetter) return run_of(c, n, 0, CodepointClass::kLetter);
  if (n > 1 && can_lead_word(c[0]) && c[1].cls == CodepointClass::kLetter) {
    return run_of(c, n, 1, CodepointClass::kLetter);
  }
  // \p{N}{1,max_digits}
  if (c[0].cls == CodepointClass::kNumber) {
    std::size_t k = 1;
    while (k < n && k < max_digits && c[k].cls == CodepointClass::kNumber) ++k;
    return k;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  if (std::size_t len = match_symbols(c, n, is_newline)) return len;
  return match_spaces(c, n);
}

// End of the longest run from c[from] of characters in `sets`.
std::size_t run_in(const Char* c, std::size_t n, std::size_t from, uint8_t sets) {
  std::size_t k = from;
  while (k < n && (c[k].case_sets & sets)) ++k;
  return k;
}

// End of [upper]*[lower]+ matched at c[from], or 0. The greedy [upper]* gives characters back one
// at a time (the sets overlap) until [lower]+ can start.
std::size_t upper_star_lower_plus(const Char* c, std::size_t n, std::size_t from) {
  const std::size_t upper_end = run_in(c, n, from, kUpperSet);
  for (std::size_t k = upper_end + 1; k-- > from;) {
    if (k < n && (c[k].case_sets & kLowerSet)) return run_in(c, n, k, kLowerSet);
  }
  return 0;
}

// End of [upper]+[lower]* matched at c[from], or 0.
std::size_t upper_plus_lower_star(const Char* c, std::size_t n, std::size_t from) {
  const std::size_t upper_end = run_in(c, n, from, kUpperSet);
  return upper_end == from ? 0 : run_in(c, n, upper_end, kLowerSet);
}

// Length (>= 1) of the Tekken pattern's match at c[0]. Its first two alternatives are
// `lead? upper* lower+` and `lead? upper+ lower*`; each tries with the lead character first.
std::size_t match_tekken(const Char* c, std::size_t n) {
  const bool lead = can_lead_word(c[0]);
  for (auto word : {upper_star_lower_plus, upper_plus_lower_star}) {
    if (lead) {
      if (std::size_t end = word(c, n, 1)) return end;
    }
    if (std::size_t end = word(c, n, 0)) return end;
  }
  if (c[0].cls == CodepointClass::kNumber) return 1;  // \p{N}
  // ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
  const auto newline_or_slash = [](const Char& ch) { return is_newline(ch) || ch.cp == '/'; };
  if (std::size_t len = match_symbols(c, n, newline_or_slash)) return len;
  return match_spaces(c, n);
}

// Splits chars[begin, end) with `match` and appends the pieces as byte ranges of `text`.
template <typename Match>
void split_segment(std::string_view text, const std::vector<Char>& chars, std::size_t begin,
                   std::size_t end, Match match, std::vector<std::string_view>& out) {
  auto byte_at = [&](std::size_t i) { return i < chars.size() ? chars[i].offset : text.size(); };
  std::size_t i = begin;
  while (i < end) {
    const std::size_t len = match(chars.data() + i, end - i);
    out.push_back(text.substr(byte_at(i), byte_at(i + len) - byte_at(i)));
    i += len;
  }
}

}  // namespace

std::optional<PreTokenizer> pre_tokenizer_from_name(std::string_view name) {
  if (name == "default" || name == "gpt-2") return PreTokenizer::kGpt2;
  if (name == "smollm") return PreTokenizer::kSmolLM;
  if (name == "llama-bpe") return PreTokenizer::kLlama3;
  if (name == "qwen2" || name == "deepseek-r1-qwen") return PreTokenizer::kQwen2;
  if (name == "tekken") return PreTokenizer::kTekken;
  return std::nullopt;
}

std::string supported_pre_tokenizer_names() {
  return "default, gpt-2, smollm, llama-bpe, qwen2, deepseek-r1-qwen, tekken";
}

std::vector<std::string_view> pre_tokenize(std::string_view text, PreTokenizer kind) {
  std::vector<Char> chars = decode_chars(text);
  if (kind == PreTokenizer::kTekken) {
    for (Char& c : chars) c.case_sets = case_sets(c.cp);
  }
  std::vector<std::string_view> pieces;
  pieces.reserve(chars.size() / 3 + 1);
  switch (kind) {
    case PreTokenizer::kGpt2:
      split_segment(text, chars, 0, chars.size(), match_gpt2, pieces);
      break;
    case PreTokenizer::kLlama3:
      split_segment(text, chars, 0, chars.size(), match_llama3<3>, pieces);
      break;
    case PreTokenizer::kQwen2:
      split_segment(text, chars, 0, chars.size(), match_llama3<1>, pieces);
      break;
    case PreTokenizer::kTekken:
      split_segment(text, chars, 0, chars.size(), match_tekken, pieces);
      break;
    case PreTokenizer::kSmolLM: {
      // Each number character is a piece; the GPT-2 pattern runs on the text between them as if
      // that text were the whole input (its lookahead stops there).
      std::size_t i = 0;
      while (i < chars.size()) {
        std::size_t end = i;
        while (end < chars.size() && chars[end].cls != CodepointClass::kNumber) ++end;
        if (end == i) end = i + 1;  // a number character on its own
        split_segment(text, chars, i, end, match_gpt2, pieces);
        i = end;
      }
      break;
    }
  }
  return pieces;
}

}  // namespace tokenfab
