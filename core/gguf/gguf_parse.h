#pragma once
// Internal to core/gguf: turns GGUF bytes into validated metadata and tensor infos. GgufFile owns
// the bytes (or the mapping) and the result; this only reads.

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"

namespace tokenfab::gguf {

// Arrays of arrays deeper than this are rejected (they would only serve to exhaust the stack).
inline constexpr int kMaxArrayDepth = 8;
// Array elements in all metadata together. Real models hold a few hundred thousand (Gemma's
// 262144-token vocabulary with scores and types is under 1M); a Value is ~48 bytes, so this bounds
// the memory a hostile file can make the reader allocate to well under 1 GiB.
inline constexpr uint64_t kMaxMetadataElements = uint64_t{1} << 24;

struct ParsedGguf {
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  // Absolute offset of the tensor data section: a multiple of `alignment` and <= the file size
  // whenever there are tensors; the file size when there are none and the padding is absent.
  uint64_t data_offset = 0;
  std::vector<KeyValue> metadata;                           // in file order
  std::vector<TensorInfo> tensors;                          // in file order, data set
  std::map<std::string, size_t, std::less<>> key_index;     // key -> index in metadata
  std::map<std::string, size_t, std::less<>> tensor_index;  // name -> index in tensors
};

// Throws Error "NAME: SECTION: what was found (what was expected)" on any malformed input.
ParsedGguf parse_gguf(std::span<const uint8_t> bytes, const std::string& name);

}  // namespace tokenfab::gguf
