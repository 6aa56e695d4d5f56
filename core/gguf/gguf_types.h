#pragma once
// GGUF vocabulary shared by the reader and the writer: value types, tensor types and their block
// sizes. Numbers follow the GGUF specification (ggml's type enumeration).

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tokenfab::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr uint32_t kMaxDims = 4;  // ggml's GGML_MAX_DIMS

enum class ValueType : uint32_t {
  UInt8 = 0,
  Int8 = 1,
  UInt16 = 2,
  Int16 = 3,
  UInt32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  UInt64 = 10,
  Int64 = 11,
  Float64 = 12,
};

const char* value_type_name(ValueType type);
bool is_known_value_type(uint32_t raw);

// ggml tensor types. Only some are computed on (see core/model); the reader knows them all so
// `info` can describe any file.
enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
};

struct TensorTypeTraits {
  const char* name;
  uint32_t block_elements;  // elements per block (1 for plain types)
  uint32_t block_bytes;     // bytes per block
};

// Traits of a known tensor type, or nullopt for a raw value no GGUF producer uses.
std::optional<TensorTypeTraits> tensor_type_traits(uint32_t raw);
const char* tensor_type_name(TensorType type);

struct TensorSize {
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
};

// Element and byte counts of a tensor of raw type `raw_type` with `dims` (ggml order). Returns
// nullopt, with the reason in `why` when given, when the type is unknown, there are no dims or
// more than kMaxDims, a dim is zero, dims[0] is not a multiple of the type's block, or a count
// does not fit in int64 (ggml's element counts are signed).
std::optional<TensorSize> tensor_size(uint32_t raw_type, std::span<const uint64_t> dims,
                                      std::string* why = nullptr);

}  // namespace tokenfab::gguf
