#include "core/tokenizer/utf8.h"

namespace tokenfab::utf8 {

namespace {

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Valid range of the second byte for a lead byte (the Unicode Standard, table 3-7); the third
// and fourth bytes are always 80..BF.
struct LeadInfo {
  uint32_t length;  // 0: not a lead byte
  uint8_t second_lo;
  uint8_t second_hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

Step decode(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const std::size_t n = bytes.size();
  if (p[0] < 0x80) return {Status::kValid, p[0], 1};
  const LeadInfo lead = lead_info(p[0]);
  if (lead.length == 0) return {Status::kInvalid, 0, 1};
  uint32_t cp = p[0] & (0xFF >> (lead.length + 1));
  for (uint32_t i = 1; i < lead.length; ++i) {
    if (i >= n) return {Status::kIncomplete, 0, static_cast<uint32_t>(n)};
    const bool ok =
        i == 1 ? (p[1] >= lead.second_lo && p[1] <= lead.second_hi) : is_continuation(p[i]);
    if (!ok) return {Status::kInvalid, 0, i};
    cp = (cp << 6) | (p[i] & 0x3F);
  }
  return {Status::kValid, cp, lead.length};
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

void append_sanitized(std::string& out, std::string_view bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    const Step step = decode(bytes.substr(i));
    if (step.status == Status::kValid) {
      out.append(bytes.substr(i, step.length));
    } else {
      append(out, kReplacement);
    }
    i += step.length;
  }
}

std::size_t complete_prefix_length(std::string_view bytes) {
  // An incomplete character is at most 3 bytes long, so only the tail needs a look.
  const std::size_t n = bytes.size();
  const std::size_t start = n > 3 ? n - 3 : 0;
  for (std::size_t i = start; i < n; ++i) {
    if (!is_continuation(static_cast<uint8_t>(bytes[i]))) {
      const Step step = decode(bytes.substr(i));
      if (step.status == Status::kIncomplete) return i;
    }
  }
  return n;
}

bool is_valid(std::string_view bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    const Step step = decode(bytes.substr(i));
    if (step.status != Status::kValid) return false;
    i += step.length;
  }
  return true;
}

}  // namespace tokenfab::utf8
