#pragma once
// GGUF v3 writer: metadata in insertion order, tensors aligned to `general.alignment`. write()
// goes through a temporary file in the same directory and a rename, so a crash never leaves a
// half-written file under the final name.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"

namespace tokenfab::gguf {

class GgufWriter {
 public:
  // Alignment of tensor data (power of two). Also stored as `general.alignment` (u32) when it
  // differs from the default 32.
  void set_alignment(uint64_t alignment);
  // Throws Error on a duplicate key.
  void add(std::string key, Value value);
  // `data` must hold exactly the bytes the type and dims imply; it is copied.
  void add_tensor(std::string name, TensorType type, std::vector<uint64_t> dims,
                  std::span<const uint8_t> data);

  std::vector<uint8_t> to_bytes() const;
  void write(const std::filesystem::path& path) const;

 private:
  struct PendingTensor {
    std::string name;
    TensorType type;
    std::vector<uint64_t> dims;
    std::vector<uint8_t> data;
  };
  uint64_t alignment_ = kDefaultAlignment;
  std::vector<KeyValue> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace tokenfab::gguf
