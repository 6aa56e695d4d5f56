#include "core/tokenizer/jinja_string.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>

#include "core/tokenizer/utf8.h"

namespace tokenfab::jinja::pystr {

namespace {

// An invalid byte b is carried as kRawByte + b, so that it is written back unchanged.
constexpr uint32_t kRawByte = 0x110000;

void append_cp(std::string& out, uint32_t cp) {
  if (cp >= kRawByte) {
    out += static_cast<char>(cp - kRawByte);
  } else {
    utf8::append(out, cp);
  }
}

// Case pairs of Latin Extended-A: in [first, last] the even (or odd) code points are capitals.
bool latin_a_upper(uint32_t cp) {
  if ((cp >= 0x100 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177)) return cp % 2 == 0;
  if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) return cp % 2 == 1;
  return false;
}
bool latin_a_lower(uint32_t cp) {
  if ((cp >= 0x100 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177)) return cp % 2 == 1;
  if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) return cp % 2 == 0;
  return false;
}

bool strip_member(uint32_t cp, const std::optional<std::vector<uint32_t>>& set) {
  if (!set) return is_space(cp);
  return std::find(set->begin(), set->end(), cp) != set->end();
}

bool is_line_break(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) ||
         cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

std::vector<std::string> split_whitespace(const std::vector<uint32_t>& cps, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t i = 0;
  const size_t n = cps.size();
  while (true) {
    while (i < n && is_space(cps[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(from_code_points(cps, i, n));
      break;
    }
    size_t j = i;
    while (j < n && !is_space(cps[j])) ++j;
    out.push_back(from_code_points(cps, i, j));
    i = j;
  }
  return out;
}

}  // namespace

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  while (!s.empty()) {
    const utf8::Step step = utf8::decode(s);
    if (step.status == utf8::Status::kValid) {
      out.push_back(step.cp);
      s.remove_prefix(step.length);
    } else {
      out.push_back(kRawByte + static_cast<uint8_t>(s[0]));
      s.remove_prefix(1);
    }
  }
  return out;
}

std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) append_cp(out, cps[i]);
  return out;
}

size_t length(std::string_view s) {
  return index_of_byte(s, s.size());
}

size_t index_of_byte(std::string_view s, size_t byte) {
  size_t n = 0;
  std::string_view rest = s.substr(0, byte);
  while (!rest.empty()) {
    const utf8::Step step = utf8::decode(rest);
    rest.remove_prefix(step.status == utf8::Status::kValid ? step.length : 1);
    ++n;
  }
  return n;
}

bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

uint32_t to_upper(uint32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp < 0x80) return cp;
  if (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) return cp - 32;
  if (cp == 0xFF) return 0x178;
  if (cp == 0xB5) return 0x39C;
  if (latin_a_lower(cp)) return cp - 1;
  if (cp >= 0x3B1 && cp <= 0x3C9) return cp == 0x3C2 ? 0x3A3 : cp - 32;
  if (cp == 0x3AC) return 0x386;
  if (cp >= 0x3AD && cp <= 0x3AF) return cp - 37;
  if (cp == 0x3CC) return 0x38C;
  if (cp == 0x3CD || cp == 0x3CE) return cp - 63;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  return cp;
}

uint32_t to_lower(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp < 0x80) return cp;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
  if (cp == 0x178) return 0xFF;
  if (latin_a_upper(cp)) return cp + 1;
  if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 32;
  if (cp == 0x386) return 0x3AC;
  if (cp >= 0x388 && cp <= 0x38A) return cp + 37;
  if (cp == 0x38C) return 0x3CC;
  if (cp == 0x38E || cp == 0x38F) return cp + 63;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  return cp;
}

bool is_alpha(uint32_t cp) {
  return cp == 0xDF || to_upper(cp) != cp || to_lower(cp) != cp;
}

std::string upper(std::string_view s) {
  std::string out;
  for (uint32_t cp : code_points(s)) {
    if (cp == 0xDF) {
      out += "SS";
    } else {
      append_cp(out, to_upper(cp));
    }
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  for (uint32_t cp : code_points(s)) append_cp(out, to_lower(cp));
  return out;
}

std::string capitalize(std::string_view s) {
  const std::vector<uint32_t> cps = code_points(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0 && cps[0] == 0xDF) {
      out += "Ss";
    } else {
      append_cp(out, i == 0 ? to_upper(cps[i]) : to_lower(cps[i]));
    }
  }
  return out;
}

std::string title_method(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (uint32_t cp : code_points(s)) {
    if (previous_cased) {
      append_cp(out, to_lower(cp));
    } else if (cp == 0xDF) {
      out += "Ss";
    } else {
      append_cp(out, to_upper(cp));
    }
    previous_cased = is_alpha(cp);
  }
  return out;
}

std::string title_filter(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (uint32_t cp : code_points(s)) {
    const bool separator =
        is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (word_start && !separator && cp == 0xDF) {
      out += "SS";
    } else {
      append_cp(out, word_start ? to_upper(cp) : to_lower(cp));
    }
    word_start = separator;
  }
  return out;
}

// Walks in from both ends without decoding the middle: content can be long, and trim is called
// on every message.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  std::optional<std::vector<uint32_t>> set;
  if (chars) set = code_points(*chars);
  // The code point starting at byte `at` (an invalid byte stands for itself) and its length.
  const auto at_front = [&](size_t at, size_t end) -> std::pair<uint32_t, size_t> {
    const utf8::Step step = utf8::decode(s.substr(at, end - at));
    if (step.status == utf8::Status::kValid) return {step.cp, step.length};
    return {kRawByte + static_cast<uint8_t>(s[at]), 1};
  };
  size_t begin = 0, end = s.size();
  while (left && begin < end) {
    const auto [cp, n] = at_front(begin, end);
    if (!strip_member(cp, set)) break;
    begin += n;
  }
  while (right && end > begin) {
    size_t start = end - 1;  // back over continuation bytes to where the last character starts
    while (start > begin && end - start < 4 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) {
      --start;
    }
    auto [cp, n] = at_front(start, end);
    if (start + n != end) {  // not one whole character: the last byte stands alone
      start = end - 1;
      cp = kRawByte + static_cast<uint8_t>(s[start]);
    }
    if (!strip_member(cp, set)) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  if (!sep) return split_whitespace(code_points(s), maxsplit);
  std::vector<std::string> out;
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t at = s.find(*sep, start);
    if (at == std::string_view::npos) break;
    out.emplace_back(s.substr(start, at - start));
    start = at + sep->size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (!sep) {
    std::vector<uint32_t> cps = code_points(s);
    size_t end = cps.size();
    while (true) {
      while (end > 0 && is_space(cps[end - 1])) --end;
      if (end == 0) break;
      if (static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(from_code_points(cps, 0, end));
        break;
      }
      size_t begin = end;
      while (begin > 0 && !is_space(cps[begin - 1])) --begin;
      out.push_back(from_code_points(cps, begin, end));
      end = begin;
    }
  } else {
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit && end >= sep->size()) {
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s) {
  const std::vector<uint32_t> cps = code_points(s);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!is_line_break(cps[i])) continue;
    out.push_back(from_code_points(cps, start, i));
    if (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) out.push_back(from_code_points(cps, start, cps.size()));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` before every character and at the end
    const std::vector<uint32_t> cps = code_points(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < cps.size()) append_cp(out, cps[i]);
    }
    return out;
  }
  size_t start = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start)).append(with);
    start = at + old.size();
  }
  out.append(s.substr(start));
  return out;
}

int64_t count(std::string_view s, std::string_view part) {
  if (part.empty()) return static_cast<int64_t>(length(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(part); at != std::string_view::npos; at = s.find(part, at + part.size()))
    ++n;
  return n;
}

int64_t find(std::string_view s, std::string_view part, bool reverse) {
  const size_t at = reverse ? s.rfind(part) : s.find(part);
  if (at == std::string_view::npos) return -1;
  return static_cast<int64_t>(index_of_byte(s, at));
}

std::string repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(1, quote);
  for (uint32_t cp : code_points(s)) {
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n' || cp == '\r' || cp == '\t') {
      out += cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : "\\t";
    } else if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD || cp >= kRawByte) {
      const uint32_t byte = cp >= kRawByte ? cp - kRawByte : cp;
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    } else if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
               (cp >= 0x205F && cp <= 0x2064) || cp == 0x3000 || cp == 0xFEFF) {
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(cp >> shift) & 15];
    } else {
      append_cp(out, cp);
    }
  }
  out += quote;
  return out;
}

std::optional<int64_t> parse_int(std::string_view s, int base) {
  std::string text = strip(s, std::nullopt, true, true);
  bool negative = false;
  size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  // Python accepts the prefix of the base (0x, 0o, 0b), and base 0 reads it to choose the base.
  const auto prefix_base = [&]() -> int {
    if (i + 1 >= text.size() || text[i] != '0') return 0;
    const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(text[i + 1])));
    return p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
  };
  if (const int prefixed = prefix_base(); prefixed != 0 && (base == 0 || base == prefixed)) {
    base = prefixed;
    i += 2;
    if (i < text.size() && text[i] == '_') ++i;
  } else if (base == 0) {
    base = 10;
  }
  if (base < 2 || base > 36) return std::nullopt;
  std::string digits;
  for (; i < text.size(); ++i) {
    if (text[i] == '_' && !digits.empty() && i + 1 < text.size() && text[i + 1] != '_') continue;
    digits += text[i];
  }
  if (digits.empty()) return std::nullopt;
  uint64_t magnitude = 0;
  const auto [end, error] =
      std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, base);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  if (magnitude > static_cast<uint64_t>(INT64_MAX) + (negative ? 1 : 0)) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
}

std::optional<double> parse_float(std::string_view s) {
  std::string text = strip(s, std::nullopt, true, true);
  std::string cleaned;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool between_digits = i > 0 && i + 1 < text.size() &&
                                std::isdigit(static_cast<unsigned char>(text[i - 1])) &&
                                std::isdigit(static_cast<unsigned char>(text[i + 1]));
    if (text[i] == '_' && between_digits) continue;
    cleaned += text[i];
  }
  bool negative = false;
  std::string_view body = cleaned;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body.empty() || body[0] == '+' || body[0] == '-' || body.find('(') != body.npos) {
    return std::nullopt;
  }
  double v = 0;
  const auto [end, error] = std::from_chars(body.data(), body.data() + body.size(), v);
  if (error != std::errc() || end != body.data() + body.size()) return std::nullopt;
  return negative ? -v : v;
}

}  // namespace tokenfab::jinja::pystr
