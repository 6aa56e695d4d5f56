#pragma once
// A writer of Hugging Face's safetensors format (what vLLM and transformers load checkpoints from):
//
//   u64 N (little-endian) | N bytes of UTF-8 JSON header | data
//
// The header maps each tensor name to {"dtype": "F32"|"F16"|"BF16", "shape": [...],
// "data_offsets": [begin, end]} (byte offsets into the data, which follows the header), plus an
// optional "__metadata__" object of string values. The tensors' byte ranges tile the data in order
// with no gap (safetensors' loaders refuse gaps and overlaps); the header is padded with spaces so
// that the data starts 8-byte aligned. Values are row-major (C order), little-endian.
//
// Tensors are streamed: each gives its values as f32 rows, converted to the stored dtype on the way
// out (round to nearest even), so a vocabulary-sized matrix never exists whole in memory.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tokenfab {

enum class SafetensorsDtype : uint8_t { kF32, kF16, kBF16 };

const char* safetensors_dtype_name(SafetensorsDtype dtype);  // "F32", "F16", "BF16"
int safetensors_dtype_bytes(SafetensorsDtype dtype);         // 4, 2, 2

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;  // as stored in the file
  std::vector<int64_t> shape;                       // the last dimension varies fastest
  // Writes row r (row_elements() floats) into `out`. A row is one index of the first dimension;
  // a 1-D tensor is one row. Called once per row, in order.
  std::function<void(int64_t r, float* out)> row;

  int64_t rows() const;          // shape[0] (1 for a 1-D tensor, 1 for a scalar)
  int64_t row_elements() const;  // the product of the other dimensions (1-D: shape[0])
  uint64_t bytes() const;        // stored bytes
};

// Where everything goes: the header text exactly as written (padded), and each tensor's
// [begin, end) byte range within the data, in the order given.
struct SafetensorsLayout {
  std::string header;
  std::vector<std::pair<uint64_t, uint64_t>> offsets;
  uint64_t data_bytes = 0;
};

// Throws Error for a tensor without a name, a duplicate name, the reserved name __metadata__, a
// negative dimension or a missing row function.
SafetensorsLayout safetensors_layout(std::span<const SafetensorsTensor> tensors,
                                     const std::map<std::string, std::string>& metadata);

// Writes the file through an AtomicFile (a temporary name, then a rename: no half file under
// `path`). Throws Error naming the file and the tensor for a value that is not finite or that
// overflows F16 (|x| beyond 65504 after rounding), and for a write that fails.
void write_safetensors(const std::filesystem::path& path,
                       std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace tokenfab
