#pragma once
// GGUF v2/v3 reader over a read-only memory map. Everything is validated before it is trusted:
// magic, version, counts against the bytes that remain, string lengths, value and tensor types,
// tensor offsets (aligned, inside the file, non-overlapping) and sizes (no overflow). A malformed
// file raises tokenfab::Error naming the file, the section and what was expected; nothing is
// allocated in proportion to an unchecked count.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/common/error.h"
#include "core/gguf/gguf_types.h"

namespace tokenfab::gguf {

// One metadata value. Arrays hold elements of one type; arrays of arrays are allowed by the
// format and kept as nested Values.
class Value {
 public:
  using Array = std::vector<Value>;
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, uint64_t, int64_t, double, Array>;

  Value() = default;
  Value(ValueType type, Storage storage, ValueType array_type = ValueType::UInt8)
      : type_(type), array_type_(array_type), storage_(std::move(storage)) {}

  static Value u8(uint8_t v) { return {ValueType::UInt8, v}; }
  static Value i8(int8_t v) { return {ValueType::Int8, v}; }
  static Value u16(uint16_t v) { return {ValueType::UInt16, v}; }
  static Value i16(int16_t v) { return {ValueType::Int16, v}; }
  static Value u32(uint32_t v) { return {ValueType::UInt32, v}; }
  static Value i32(int32_t v) { return {ValueType::Int32, v}; }
  static Value f32(float v) { return {ValueType::Float32, v}; }
  static Value boolean(bool v) { return {ValueType::Bool, v}; }
  static Value string(std::string v) { return {ValueType::String, std::move(v)}; }
  static Value u64(uint64_t v) { return {ValueType::UInt64, v}; }
  static Value i64(int64_t v) { return {ValueType::Int64, v}; }
  static Value f64(double v) { return {ValueType::Float64, v}; }
  // Every element must have type `element_type`.
  static Value array(ValueType element_type, Array items);
  static Value string_array(const std::vector<std::string>& items);

  ValueType type() const { return type_; }
  ValueType array_type() const { return array_type_; }  // meaningful when type() == Array
  const Storage& storage() const { return storage_; }

  // Conversions that throw Error (with `what` in the message) when the value does not fit:
  bool is_integer() const;
  int64_t as_int(std::string_view what = "value") const;    // any integer type, range-checked
  uint64_t as_uint(std::string_view what = "value") const;  // any non-negative integer
  double as_float(std::string_view what = "value") const;   // any number
  bool as_bool(std::string_view what = "value") const;
  const std::string& as_string(std::string_view what = "value") const;
  const Array& as_array(std::string_view what = "value") const;
  std::vector<std::string> as_string_array(std::string_view what = "value") const;
  std::vector<int64_t> as_int_array(std::string_view what = "value") const;
  std::vector<double> as_float_array(std::string_view what = "value") const;

  bool operator==(const Value& other) const = default;

 private:
  ValueType type_ = ValueType::UInt8;
  ValueType array_type_ = ValueType::UInt8;
  Storage storage_ = uint8_t{0};
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the contiguous (fastest) dimension
  TensorType type = TensorType::F32;
  uint64_t offset = 0;       // relative to the start of the tensor data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping; valid while the GgufFile lives
};

class GgufFile {
 public:
  // Maps `path` read-only and validates it. Throws Error on any problem.
  static GgufFile open(const std::filesystem::path& path);
  // Parses bytes held by the caller (kept alive by the caller); `name` is used in messages.
  static GgufFile parse(std::span<const uint8_t> bytes, std::string name);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& name() const;  // the path or the name given to parse()
  uint32_t version() const;
  uint64_t alignment() const;
  uint64_t file_size() const;
  uint64_t data_offset() const;  // absolute offset of the tensor data section
  std::span<const uint8_t> bytes() const;

  const std::vector<KeyValue>& metadata() const;  // in file order
  const Value* find(std::string_view key) const;  // nullptr when absent
  // Throws Error "FILE: missing metadata key KEY" when absent.
  const Value& get(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const;  // in file order
  const TensorInfo* find_tensor(std::string_view name) const;
  const TensorInfo& tensor(std::string_view name) const;  // throws when absent

 private:
  struct State;
  explicit GgufFile(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tokenfab::gguf
