#include "core/tokenizer/byte_level.h"

#include <array>

#include "core/tokenizer/utf8.h"

namespace tokenfab::byte_level {

namespace {

bool stands_for_itself(uint32_t byte) {
  return (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

struct Tables {
  std::array<std::string, 256> text;      // byte -> UTF-8 of its character
  std::array<int16_t, 0x144> byte_of_cp;  // code point (< U+0144) -> byte, or -1
  Tables() {
    byte_of_cp.fill(-1);
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      const uint32_t cp = stands_for_itself(b) ? b : next++;
      utf8::append(text[b], cp);
      byte_of_cp[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& byte_to_text(uint8_t byte) { return tables().text[byte]; }

bool text_to_bytes(std::string_view text, std::string& out) {
  const Tables& t = tables();
  bool all_mapped = true;
  std::size_t i = 0;
  while (i < text.size()) {
    const utf8::Step step = utf8::decode(text.substr(i));
    const uint32_t length = step.status == utf8::Status::kValid ? step.length : 1;
    if (step.status == utf8::Status::kValid && step.cp < t.byte_of_cp.size() &&
        t.byte_of_cp[step.cp] >= 0) {
      out += static_cast<char>(t.byte_of_cp[step.cp]);
    } else {
      out.append(text.substr(i, length));
      all_mapped = false;
    }
    i += length;
  }
  return all_mapped;
}

}  // namespace tokenfab::byte_level
