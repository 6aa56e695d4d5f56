#include "core/gguf/gguf_writer.h"

#include <bit>
#include <cstring>
#include <limits>
#include <span>

#include "core/common/atomic_file.h"
#include "core/gguf/gguf_parse.h"

namespace tokenfab::gguf {

namespace {

constexpr const char* kAlignmentKey = "general.alignment";

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// Index of the Storage alternative that holds a value of `type` (the variant lists the types in
// enum order, except that Array comes last).
size_t storage_index(ValueType type) {
  switch (type) {
    case ValueType::Array: return 12;
    case ValueType::UInt64: return 9;
    case ValueType::Int64: return 10;
    case ValueType::Float64: return 11;
    default: return static_cast<size_t>(type);
  }
}

// Throws unless `value` is one the reader would accept back: storage matching the type tag, array
// elements all of the declared type, nesting within kMaxArrayDepth.
void check_value(const std::string& key, const Value& value, int depth) {
  auto bad = [&key](const std::string& what) {
    throw Error("gguf writer: metadata '" + key + "': " + what);
  };
  if (!is_known_value_type(static_cast<uint32_t>(value.type()))) bad("unknown value type");
  if (value.storage().index() != storage_index(value.type())) {
    bad(std::string("value tagged ") + value_type_name(value.type()) + " holds another type");
  }
  if (value.type() != ValueType::Array) return;
  if (depth + 1 >= kMaxArrayDepth) bad("arrays nested too deep");
  for (const Value& item : std::get<Value::Array>(value.storage())) {
    if (item.type() != value.array_type()) {
      bad(std::string("array element of type ") + value_type_name(item.type()) +
          " in an array of " + value_type_name(value.array_type()));
    }
    check_value(key, item, depth + 1);
  }
}

uint32_t checked_alignment(uint64_t alignment) {
  if (!std::has_single_bit(alignment) || alignment > std::numeric_limits<uint32_t>::max()) {
    throw Error("gguf writer: alignment " + std::to_string(alignment) +
                " is not valid (expected a non-zero power of two that fits in uint32)");
  }
  return static_cast<uint32_t>(alignment);
}

class Encoder {
 public:
  explicit Encoder(std::vector<uint8_t>& out) : out_(out) {}
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  // The payload of `value`, without its type tag (GGUF writes the tag apart for arrays).
  void put_value(const Value& value) {
    std::visit(
        [this, &value](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) {
            put_string(v);
          } else if constexpr (std::is_same_v<T, Value::Array>) {
            put<uint32_t>(static_cast<uint32_t>(value.array_type()));
            put<uint64_t>(v.size());
            for (const Value& item : v) put_value(item);
          } else if constexpr (std::is_same_v<T, bool>) {
            put<uint8_t>(v ? 1 : 0);
          } else {
            put<T>(v);
          }
        },
        value.storage());
  }
  void pad_to(uint64_t alignment) { out_.resize(align_up(out_.size(), alignment), 0); }

 private:
  std::vector<uint8_t>& out_;
};

}  // namespace

void GgufWriter::set_alignment(uint64_t alignment) {
  const uint32_t a = checked_alignment(alignment);
  alignment_ = a;
  for (auto& kv : metadata_) {
    if (kv.key == kAlignmentKey) {
      kv.value = Value::u32(a);
      return;
    }
  }
  if (a != kDefaultAlignment) metadata_.push_back({kAlignmentKey, Value::u32(a)});
}

void GgufWriter::add(std::string key, Value value) {
  if (key.empty()) throw Error("gguf writer: empty metadata key");
  for (const auto& kv : metadata_) {
    if (kv.key == key) throw Error("gguf writer: duplicate metadata key '" + key + "'");
  }
  check_value(key, value, 0);
  if (key == kAlignmentKey) {
    if (value.type() != ValueType::UInt32) {
      throw Error(std::string("gguf writer: general.alignment must be uint32, got ") +
                  value_type_name(value.type()));
    }
    alignment_ = checked_alignment(std::get<uint32_t>(value.storage()));
  }
  metadata_.push_back({std::move(key), std::move(value)});
}

void GgufWriter::add_tensor(std::string name, TensorType type, std::vector<uint64_t> dims,
                            std::span<const uint8_t> data) {
  if (name.empty()) throw Error("gguf writer: empty tensor name");
  for (const auto& t : tensors_) {
    if (t.name == name) throw Error("gguf writer: duplicate tensor name '" + name + "'");
  }
  std::string why;
  auto size = tensor_size(static_cast<uint32_t>(type), dims, &why);
  if (!size) throw Error("gguf writer: tensor '" + name + "': " + why);
  if (data.size() != size->n_bytes) {
    throw Error("gguf writer: tensor '" + name + "': data has " + std::to_string(data.size()) +
                " bytes, expected " + std::to_string(size->n_bytes) + " for " +
                tensor_type_name(type) + " with " + std::to_string(size->n_elements) + " elements");
  }
  tensors_.push_back({std::move(name), type, std::move(dims), {data.begin(), data.end()}});
}

// Everything before the tensor data: header, metadata, tensor infos, padding to the alignment.
// Tensor k starts at the sum of the padded sizes of tensors 0..k-1 (relative to the data section).
static std::vector<uint8_t> encode_head(uint64_t alignment, const std::vector<KeyValue>& metadata,
                                        const auto& tensors) {
  std::vector<uint8_t> out;
  Encoder enc(out);
  enc.put<uint32_t>(kMagic);
  enc.put<uint32_t>(3);
  enc.put<uint64_t>(tensors.size());
  enc.put<uint64_t>(metadata.size());
  for (const auto& kv : metadata) {
    enc.put_string(kv.key);
    enc.put<uint32_t>(static_cast<uint32_t>(kv.value.type()));
    enc.put_value(kv.value);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    enc.put_string(t.name);
    enc.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) enc.put<uint64_t>(d);
    enc.put<uint32_t>(static_cast<uint32_t>(t.type));
    enc.put<uint64_t>(offset);
    offset += align_up(t.data.size(), alignment);
  }
  enc.pad_to(alignment);
  return out;
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  std::vector<uint8_t> out = encode_head(alignment_, metadata_, tensors_);
  for (const auto& t : tensors_) {
    out.insert(out.end(), t.data.begin(), t.data.end());
    out.resize(align_up(out.size(), alignment_), 0);
  }
  return out;
}

void GgufWriter::write(const std::filesystem::path& path) const {
  const std::vector<uint8_t> head = encode_head(alignment_, metadata_, tensors_);
  AtomicFile file(path);
  file.write(head);
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (const auto& t : tensors_) {
    file.write(t.data);
    file.write(std::span(zeros).first(align_up(t.data.size(), alignment_) - t.data.size()));
  }
  file.commit();
}

}  // namespace tokenfab::gguf
