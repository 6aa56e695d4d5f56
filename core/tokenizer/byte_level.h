#pragma once
// The GPT-2 byte-to-unicode mapping: byte-level BPE vocabularies store each byte as a printable
// character (bytes 0x21..0x7E, 0xA1..0xAC and 0xAE..0xFF stand for themselves; the other 68 bytes
// map to U+0100.. in byte order, so a space is "Ġ" U+0120 and a newline "Ċ" U+010A).

#include <cstdint>
#include <string>
#include <string_view>

namespace tokenfab::byte_level {

// UTF-8 text of the character that stands for `byte` in the vocabulary.
const std::string& byte_to_text(uint8_t byte);

// Appends the bytes a vocabulary entry stands for. Returns false when the entry holds a character
// outside the mapping; that character's own UTF-8 is appended then.
bool text_to_bytes(std::string_view text, std::string& out);

}  // namespace tokenfab::byte_level
