#include "core/gguf/type_mix.h"

#include "core/gguf/file_type.h"

namespace tokenfab::gguf {

void TypeMix::add(const TensorInfo& tensor) {
  TypeShare& share = by_type[tensor_type_name(tensor.type)];
  ++share.tensors;
  share.elements += tensor.n_elements;
  share.bytes += tensor.n_bytes;
  ++tensors;
  elements += tensor.n_elements;
  bytes += tensor.n_bytes;
}

void TypeMix::add(const TypeMix& other) {
  for (const auto& [type, s] : other.by_type) {
    TypeShare& share = by_type[type];
    share.tensors += s.tensors;
    share.elements += s.elements;
    share.bytes += s.bytes;
  }
  tensors += other.tensors;
  elements += other.elements;
  bytes += other.bytes;
}

double TypeMix::bits_per_weight() const {
  return elements > 0 ? 8.0 * static_cast<double>(bytes) / static_cast<double>(elements) : 0.0;
}

double TypeMix::bytes_fraction(const std::string& type) const {
  const auto it = by_type.find(type);
  if (it == by_type.end() || bytes == 0) return 0.0;
  return static_cast<double>(it->second.bytes) / static_cast<double>(bytes);
}

TypeMix type_mix(const GgufFile& file) {
  TypeMix mix;
  for (const TensorInfo& t : file.tensors()) mix.add(t);
  return mix;
}

std::optional<std::string> stated_file_type(const GgufFile& file) {
  const Value* ft = file.find("general.file_type");
  if (ft == nullptr || !ft->is_integer()) return std::nullopt;
  const int64_t v = ft->as_int("general.file_type");
  const std::optional<std::string> name =
      v >= 0 && v <= UINT32_MAX ? file_type_name(static_cast<uint32_t>(v)) : std::nullopt;
  return name.value_or("unknown (" + std::to_string(v) + ")");
}

}  // namespace tokenfab::gguf
