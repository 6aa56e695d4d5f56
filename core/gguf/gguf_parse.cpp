#include "core/gguf/gguf_parse.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <numeric>

namespace tokenfab::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes little endian");

namespace {

// Smallest encodings, used to bound counts by the bytes that remain before anything is allocated.
constexpr uint64_t kMinStringBytes = 8;            // u64 length, empty payload
constexpr uint64_t kMinArrayBytes = 4 + 8;         // element type + length, no elements
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;  // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes =
    8 + 4 + 8 + 4 + 8;  // empty name, n_dims, 1 dim, type, offset

uint64_t encoded_min_size(ValueType type) {
  switch (type) {
    case ValueType::UInt8:
    case ValueType::Int8:
    case ValueType::Bool: return 1;
    case ValueType::UInt16:
    case ValueType::Int16: return 2;
    case ValueType::UInt32:
    case ValueType::Int32:
    case ValueType::Float32: return 4;
    case ValueType::UInt64:
    case ValueType::Int64:
    case ValueType::Float64: return 8;
    case ValueType::String: return kMinStringBytes;
    case ValueType::Array: return kMinArrayBytes;
  }
  return 1;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

class Parser {
 public:
  Parser(std::span<const uint8_t> bytes, const std::string& name)
      : base_(bytes.data()), size_(bytes.size()), name_(name) {}

  ParsedGguf run() {
    read_header();
    for (uint64_t i = 0; i < n_kv_; ++i) read_key_value(i);
    for (uint64_t i = 0; i < n_tensors_; ++i) read_tensor_info(i);
    place_tensors();
    return std::move(out_);
  }

 private:
  // --- errors -----------------------------------------------------------------------------
  std::string where() const {
    std::string w = section_;
    if (index_ >= 0) w += " #" + std::to_string(index_);
    if (!subject_.empty()) w += " '" + subject_ + "'";
    if (path_len_ > 0) {
      w += " array element ";
      for (int d = 0; d < path_len_; ++d) w += "[" + std::to_string(path_[d]) + "]";
    }
    return w;
  }
  [[noreturn]] void fail(const std::string& detail) const {
    throw Error(name_ + ": " + where() + ": " + detail);
  }
  void enter(const char* section, int64_t index) {
    section_ = section;
    index_ = index;
    subject_.clear();
  }

  // --- primitive reads (every read is bounds-checked) --------------------------------------
  uint64_t remaining() const { return size_ - pos_; }
  void need(uint64_t n, const char* field) const {
    if (n > remaining()) {
      fail(std::string(field) + " at offset " + std::to_string(pos_) + " needs " +
           std::to_string(n) + " bytes, " + std::to_string(remaining()) +
           " remain (file is truncated)");
    }
  }
  template <class T>
  T read(const char* field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view read_string(const char* field) {
    const uint64_t at = pos_;
    const uint64_t len = read<uint64_t>(field);
    if (len > remaining()) {
      fail(std::string(field) + ": string length " + std::to_string(len) + " at offset " +
           std::to_string(at) + " exceeds the " + std::to_string(remaining()) +
           " bytes that remain");
    }
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }
  // A count of items that each take at least `min_item_bytes` in the file.
  uint64_t read_count(const char* field, uint64_t min_item_bytes, const char* item) {
    const uint64_t count = read<uint64_t>(field);
    if (count > remaining() / min_item_bytes) {
      fail(std::string(field) + " " + std::to_string(count) + " cannot fit in the " +
           std::to_string(remaining()) + " bytes that remain (each " + item + " takes at least " +
           std::to_string(min_item_bytes) + " bytes)");
    }
    return count;
  }

  // --- sections ------------------------------------------------------------------------------
  void read_header() {
    enter("header", -1);
    if (size_ == 0) fail("file is empty (expected a GGUF file)");
    const uint32_t magic = read<uint32_t>("magic");
    if (magic != kMagic) {
      fail("bad magic " + hex32(magic) + " (expected " + hex32(kMagic) +
           ", \"GGUF\"; this is not a GGUF file)");
    }
    const uint32_t version = read<uint32_t>("version");
    if (version == 1) {
      fail(
          "GGUF version 1 is not supported (expected version 2 or 3; re-convert the model with a "
          "current llama.cpp)");
    }
    const uint32_t swapped = __builtin_bswap32(version);
    if (swapped == 2 || swapped == 3) {
      fail("big-endian GGUF file (version field " + hex32(version) +
           ") is not supported (expected a little-endian file)");
    }
    if (version != 2 && version != 3) {
      fail("unsupported GGUF version " + std::to_string(version) + " (expected 2 or 3)");
    }
    out_.version = version;
    n_tensors_ = read_count("tensor count", kMinTensorInfoBytes, "tensor info");
    n_kv_ = read_count("metadata count", kMinKeyValueBytes, "metadata entry");
  }

  void read_key_value(uint64_t i) {
    enter("metadata", static_cast<int64_t>(i));
    const std::string_view key = read_string("key");
    if (key.empty()) fail("empty key (expected a name such as general.architecture)");
    subject_ = key;
    if (auto it = out_.key_index.find(key); it != out_.key_index.end()) {
      fail("duplicate metadata key (first defined at metadata #" + std::to_string(it->second) +
           ")");
    }
    const uint32_t raw = read<uint32_t>("value type");
    if (!is_known_value_type(raw)) {
      fail("unknown value type " + std::to_string(raw) + " (expected 0 to 12)");
    }
    Value value = read_value(static_cast<ValueType>(raw), 0);
    if (key == "general.alignment") check_alignment(value);
    out_.key_index.emplace(key, out_.metadata.size());
    out_.metadata.push_back({std::string(key), std::move(value)});
  }

  void check_alignment(const Value& value) {
    if (value.type() != ValueType::UInt32) {
      fail(std::string("has type ") + value_type_name(value.type()) + " (expected uint32)");
    }
    const uint32_t a = std::get<uint32_t>(value.storage());
    if (!std::has_single_bit(a)) {
      fail("alignment " + std::to_string(a) + " is not valid (expected a non-zero power of two)");
    }
    out_.alignment = a;
  }

  bool read_bool(const char* field) {
    const uint64_t at = pos_;
    const uint8_t b = read<uint8_t>(field);
    if (b > 1) {
      fail(std::string(field) + ": bool byte " + std::to_string(b) + " at offset " +
           std::to_string(at) + " (expected 0 or 1)");
    }
    return b == 1;
  }

  Value read_value(ValueType type, int depth) {
    switch (type) {
      case ValueType::UInt8: return Value::u8(read<uint8_t>("value"));
      case ValueType::Int8: return Value::i8(read<int8_t>("value"));
      case ValueType::UInt16: return Value::u16(read<uint16_t>("value"));
      case ValueType::Int16: return Value::i16(read<int16_t>("value"));
      case ValueType::UInt32: return Value::u32(read<uint32_t>("value"));
      case ValueType::Int32: return Value::i32(read<int32_t>("value"));
      case ValueType::Float32: return Value::f32(read<float>("value"));
      case ValueType::Bool: return Value::boolean(read_bool("value"));
      case ValueType::String: return Value::string(std::string(read_string("value")));
      case ValueType::UInt64: return Value::u64(read<uint64_t>("value"));
      case ValueType::Int64: return Value::i64(read<int64_t>("value"));
      case ValueType::Float64: return Value::f64(read<double>("value"));
      case ValueType::Array: return read_array(depth);
    }
    fail("unknown value type");  // unreachable: the caller checked the raw type
  }

  // Elements of a fixed-size type; the caller has checked that count * sizeof(T) bytes remain.
  template <class T>
  void read_scalars(Value::Array& items, ValueType type, uint64_t count) {
    for (uint64_t i = 0; i < count; ++i, pos_ += sizeof(T)) {
      T v;
      std::memcpy(&v, base_ + pos_, sizeof(T));
      items.emplace_back(type, v);
    }
  }

  Value read_array(int depth) {
    const uint32_t raw = read<uint32_t>("array element type");
    if (!is_known_value_type(raw)) {
      fail("unknown array element type " + std::to_string(raw) + " (expected 0 to 12)");
    }
    const auto type = static_cast<ValueType>(raw);
    if (type == ValueType::Array && depth + 1 >= kMaxArrayDepth) {
      fail("arrays nested more than " + std::to_string(kMaxArrayDepth) + " deep");
    }
    const uint64_t count = read_count("array length", encoded_min_size(type), "element");
    metadata_elements_ += count;
    if (metadata_elements_ > kMaxMetadataElements) {
      fail("metadata arrays hold more than " + std::to_string(kMaxMetadataElements) +
           " elements in all (the limit of this reader)");
    }
    Value::Array items;
    items.reserve(count);
    path_len_ = depth + 1;
    switch (type) {
      case ValueType::UInt8: read_scalars<uint8_t>(items, type, count); break;
      case ValueType::Int8: read_scalars<int8_t>(items, type, count); break;
      case ValueType::UInt16: read_scalars<uint16_t>(items, type, count); break;
      case ValueType::Int16: read_scalars<int16_t>(items, type, count); break;
      case ValueType::UInt32: read_scalars<uint32_t>(items, type, count); break;
      case ValueType::Int32: read_scalars<int32_t>(items, type, count); break;
      case ValueType::Float32: read_scalars<float>(items, type, count); break;
      case ValueType::UInt64: read_scalars<uint64_t>(items, type, count); break;
      case ValueType::Int64: read_scalars<int64_t>(items, type, count); break;
      case ValueType::Float64: read_scalars<double>(items, type, count); break;
      case ValueType::Bool:
      case ValueType::String:
      case ValueType::Array:
        for (uint64_t i = 0; i < count; ++i) {
          path_[depth] = i;
          items.push_back(read_value(type, depth + 1));
          path_len_ = depth + 1;  // a nested array shortened it on return
        }
        break;
    }
    path_len_ = depth;
    return Value(ValueType::Array, std::move(items), type);
  }

  void read_tensor_info(uint64_t i) {
    enter("tensor info", static_cast<int64_t>(i));
    const std::string_view name = read_string("name");
    if (name.empty()) fail("empty tensor name");
    subject_ = name;
    if (auto it = out_.tensor_index.find(name); it != out_.tensor_index.end()) {
      fail("duplicate tensor name (first defined at tensor info #" + std::to_string(it->second) +
           ")");
    }
    const uint32_t n_dims = read<uint32_t>("n_dims");
    if (n_dims == 0 || n_dims > kMaxDims) {
      fail("n_dims " + std::to_string(n_dims) + " (expected 1 to " + std::to_string(kMaxDims) +
           ")");
    }
    need(uint64_t{n_dims} * 8, "dims");
    TensorInfo info;
    info.name = name;
    info.dims.resize(n_dims);
    for (auto& d : info.dims) d = read<uint64_t>("dims");
    const uint32_t raw_type = read<uint32_t>("type");
    if (!tensor_type_traits(raw_type)) {
      fail("unknown tensor type " + std::to_string(raw_type) + " (expected a ggml type)");
    }
    info.type = static_cast<TensorType>(raw_type);
    info.offset = read<uint64_t>("data offset");
    std::string why;
    auto size = tensor_size(raw_type, info.dims, &why);
    if (!size) fail(why);
    info.n_elements = size->n_elements;
    info.n_bytes = size->n_bytes;
    out_.tensor_index.emplace(name, out_.tensors.size());
    out_.tensors.push_back(std::move(info));
  }

  // Checks offsets (aligned, inside the file, non-overlapping) and sets each tensor's data.
  void place_tensors() {
    enter("tensor data", -1);
    const uint64_t a = out_.alignment;
    const uint64_t start = (pos_ + a - 1) / a * a;  // pos_ <= size_ < 2^63, a <= 2^31
    if (out_.tensors.empty()) {
      out_.data_offset = std::min(start, size_);
      return;
    }
    if (start > size_) {
      fail("section starts at offset " + std::to_string(start) + " (header end " +
           std::to_string(pos_) + " padded to alignment " + std::to_string(a) +
           ") but the file is " + std::to_string(size_) + " bytes (file is truncated)");
    }
    out_.data_offset = start;
    const uint64_t data_size = size_ - start;
    for (auto& t : out_.tensors) {
      enter("tensor data", -1);
      subject_ = t.name;
      if (t.offset % a != 0) {
        fail("offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
             std::to_string(a));
      }
      if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
        fail("data at offset " + std::to_string(t.offset) + " + " + std::to_string(t.n_bytes) +
             " bytes runs past the end of the file (the data section holds " +
             std::to_string(data_size) + " bytes; file is truncated?)");
      }
      t.data = base_ + start + t.offset;
    }
    check_overlaps();
  }

  void check_overlaps() {
    const auto& ts = out_.tensors;
    std::vector<size_t> order(ts.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(),
              [&ts](size_t x, size_t y) { return ts[x].offset < ts[y].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
      const TensorInfo& prev = ts[order[k - 1]];
      const TensorInfo& cur = ts[order[k]];
      if (cur.offset < prev.offset + prev.n_bytes) {
        subject_ = cur.name;
        fail("data [" + std::to_string(cur.offset) + ", " +
             std::to_string(cur.offset + cur.n_bytes) + ") overlaps tensor '" + prev.name + "' [" +
             std::to_string(prev.offset) + ", " + std::to_string(prev.offset + prev.n_bytes) + ")");
      }
    }
  }

  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  uint64_t metadata_elements_ = 0;

  // Where we are, for messages: "metadata #3 'tokenizer.ggml.tokens' array element [17]".
  const char* section_ = "header";
  int64_t index_ = -1;
  std::string subject_;
  uint64_t path_[kMaxArrayDepth] = {};
  int path_len_ = 0;

  ParsedGguf out_;
};

}  // namespace

ParsedGguf parse_gguf(std::span<const uint8_t> bytes, const std::string& name) {
  return Parser(bytes, name).run();
}

}  // namespace tokenfab::gguf
