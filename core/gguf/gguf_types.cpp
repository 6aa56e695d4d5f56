#include "core/gguf/gguf_types.h"

#include <array>
#include <limits>

namespace tokenfab::gguf {

const char* value_type_name(ValueType type) {
  switch (type) {
    case ValueType::UInt8: return "uint8";
    case ValueType::Int8: return "int8";
    case ValueType::UInt16: return "uint16";
    case ValueType::Int16: return "int16";
    case ValueType::UInt32: return "uint32";
    case ValueType::Int32: return "int32";
    case ValueType::Float32: return "float32";
    case ValueType::Bool: return "bool";
    case ValueType::String: return "string";
    case ValueType::Array: return "array";
    case ValueType::UInt64: return "uint64";
    case ValueType::Int64: return "int64";
    case ValueType::Float64: return "float64";
  }
  return "unknown";
}

bool is_known_value_type(uint32_t raw) { return raw <= static_cast<uint32_t>(ValueType::Float64); }

namespace {

constexpr uint32_t kQkK = 256;  // elements per K-quant / IQ super-block

struct TraitsEntry {
  bool known = false;
  TensorTypeTraits traits{"", 0, 0};
};

// Indexed by the raw ggml type. Block sizes and bytes follow ggml's type_traits (the same table as
// gguf-py's GGML_QUANT_SIZES). Raw values 4, 5 (Q4_2, Q4_3) and 31..33, 36..38 (repacked
// layouts) were removed from ggml and never appear in GGUF files.
constexpr auto kTraits = [] {
  std::array<TraitsEntry, 36> t{};
  auto set = [&t](TensorType type, const char* name, uint32_t block_elements,
                  uint32_t block_bytes) {
    t[static_cast<uint32_t>(type)] = {true, {name, block_elements, block_bytes}};
  };
  set(TensorType::F32, "F32", 1, 4);
  set(TensorType::F16, "F16", 1, 2);
  set(TensorType::Q4_0, "Q4_0", 32, 2 + 16);
  set(TensorType::Q4_1, "Q4_1", 32, 2 + 2 + 16);
  set(TensorType::Q5_0, "Q5_0", 32, 2 + 4 + 16);
  set(TensorType::Q5_1, "Q5_1", 32, 2 + 2 + 4 + 16);
  set(TensorType::Q8_0, "Q8_0", 32, 2 + 32);
  set(TensorType::Q8_1, "Q8_1", 32, 4 + 32);
  set(TensorType::Q2_K, "Q2_K", kQkK, 2 + 2 + kQkK / 16 + kQkK / 4);               // 84
  set(TensorType::Q3_K, "Q3_K", kQkK, 2 + kQkK / 4 + kQkK / 8 + 12);               // 110
  set(TensorType::Q4_K, "Q4_K", kQkK, 2 + 2 + kQkK / 2 + 12);                      // 144
  set(TensorType::Q5_K, "Q5_K", kQkK, 2 + 2 + kQkK / 2 + kQkK / 8 + 12);           // 176
  set(TensorType::Q6_K, "Q6_K", kQkK, 2 + kQkK / 2 + kQkK / 4 + kQkK / 16);        // 210
  set(TensorType::Q8_K, "Q8_K", kQkK, 4 + kQkK + kQkK / 8);                        // 292
  set(TensorType::IQ2_XXS, "IQ2_XXS", kQkK, 2 + kQkK / 4);                         // 66
  set(TensorType::IQ2_XS, "IQ2_XS", kQkK, 2 + kQkK / 4 + kQkK / 32);               // 74
  set(TensorType::IQ3_XXS, "IQ3_XXS", kQkK, 2 + kQkK / 4 + kQkK / 8);              // 98
  set(TensorType::IQ1_S, "IQ1_S", kQkK, 2 + kQkK / 8 + kQkK / 16);                 // 50
  set(TensorType::IQ4_NL, "IQ4_NL", 32, 2 + 16);                                   // 18
  set(TensorType::IQ3_S, "IQ3_S", kQkK, 2 + kQkK / 4 + kQkK / 8 + kQkK / 32 + 4);  // 110
  set(TensorType::IQ2_S, "IQ2_S", kQkK, 2 + kQkK / 4 + kQkK / 16);                 // 82
  set(TensorType::IQ4_XS, "IQ4_XS", kQkK, 2 + 2 + kQkK / 2 + kQkK / 64);           // 136
  set(TensorType::I8, "I8", 1, 1);
  set(TensorType::I16, "I16", 1, 2);
  set(TensorType::I32, "I32", 1, 4);
  set(TensorType::I64, "I64", 1, 8);
  set(TensorType::F64, "F64", 1, 8);
  set(TensorType::IQ1_M, "IQ1_M", kQkK, kQkK / 8 + kQkK / 16 + kQkK / 32);  // 56
  set(TensorType::BF16, "BF16", 1, 2);
  set(TensorType::TQ1_0, "TQ1_0", kQkK, 2 + 4 * 13);  // 54
  set(TensorType::TQ2_0, "TQ2_0", kQkK, 2 + 64);      // 66
  return t;
}();

}  // namespace

std::optional<TensorTypeTraits> tensor_type_traits(uint32_t raw) {
  if (raw >= kTraits.size() || !kTraits[raw].known) return std::nullopt;
  return kTraits[raw].traits;
}

const char* tensor_type_name(TensorType type) {
  auto traits = tensor_type_traits(static_cast<uint32_t>(type));
  return traits ? traits->name : "unknown";
}

std::optional<TensorSize> tensor_size(uint32_t raw_type, std::span<const uint64_t> dims,
                                      std::string* why) {
  auto fail = [why](std::string reason) -> std::optional<TensorSize> {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  auto traits = tensor_type_traits(raw_type);
  if (!traits) return fail("unknown tensor type " + std::to_string(raw_type));
  if (dims.empty() || dims.size() > kMaxDims) {
    return fail(std::to_string(dims.size()) + " dims (expected 1 to " + std::to_string(kMaxDims) +
                ")");
  }
  constexpr uint64_t kMaxCount = std::numeric_limits<int64_t>::max();
  uint64_t n_elements = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 0) return fail("dims[" + std::to_string(i) + "] is 0 (expected >= 1)");
    if (dims[i] > kMaxCount / n_elements) {
      return fail("element count overflows int64 at dims[" + std::to_string(i) +
                  "] = " + std::to_string(dims[i]));
    }
    n_elements *= dims[i];
  }
  if (dims[0] % traits->block_elements != 0) {
    return fail("dims[0] = " + std::to_string(dims[0]) + " is not a multiple of the " +
                traits->name + " block size " + std::to_string(traits->block_elements));
  }
  const uint64_t n_blocks = n_elements / traits->block_elements;
  if (n_blocks > kMaxCount / traits->block_bytes) {
    return fail("byte size overflows int64 (" + std::to_string(n_blocks) + " blocks of " +
                std::to_string(traits->block_bytes) + " bytes)");
  }
  return TensorSize{n_elements, n_blocks * traits->block_bytes};
}

}  // namespace tokenfab::gguf
