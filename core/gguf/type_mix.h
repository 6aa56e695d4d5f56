#pragma once
// What a GGUF file's tensors are made of, from its header alone: the tensors, elements and bytes
// of each tensor type, the totals (the parameter count is the elements), bits per weight, and the
// file type its producer stated (general.file_type). Nothing model-specific; any valid GGUF.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "core/gguf/gguf_reader.h"

namespace tokenfab::gguf {

struct TypeShare {
  int64_t tensors = 0;
  uint64_t elements = 0;
  uint64_t bytes = 0;
};

struct TypeMix {
  std::map<std::string, TypeShare> by_type;  // by tensor type name ("Q4_K", "F32", …)
  int64_t tensors = 0;
  uint64_t elements = 0;  // every tensor's elements: the parameter count
  uint64_t bytes = 0;     // every tensor's bytes: the weights' size

  void add(const TensorInfo& tensor);
  void add(const TypeMix& other);                        // another part of a split file
  double bits_per_weight() const;                        // 8 · bytes / elements; 0 for no elements
  double bytes_fraction(const std::string& type) const;  // of `bytes`
};

TypeMix type_mix(const GgufFile& file);

// general.file_type's name ("Q4_K_M"), "unknown (N)" for a value no producer uses, or nullopt when
// the file does not state it.
std::optional<std::string> stated_file_type(const GgufFile& file);

}  // namespace tokenfab::gguf
