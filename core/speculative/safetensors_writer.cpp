#include "core/speculative/safetensors_writer.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/common/atomic_file.h"
#include "core/common/error.h"
#include "kernels/cpu/quant_types.h"

namespace tokenfab {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian values; this writer copies host bytes");

namespace {

constexpr uint64_t kAlignment = 8;               // the data starts at a multiple of this
constexpr size_t kFlushBytes = size_t{1} << 22;  // write in pieces of about 4 MiB

// Converts row r of `t` (n floats in x) to its stored bytes at the end of `out`.
void append_row(const SafetensorsTensor& t, int64_t r, const float* x, int64_t n,
                const std::filesystem::path& path, std::vector<uint8_t>& out) {
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(n) * safetensors_dtype_bytes(t.dtype));
  uint8_t* dst = out.data() + at;
  auto fail = [&](int64_t i, const char* why) {
    throw Error("cannot write " + path.string() + ": tensor " + t.name + " holds " +
                std::to_string(x[i]) + " at element " + std::to_string(r * t.row_elements() + i) +
                ", " + why);
  };
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) fail(i, "which is not finite");
  switch (t.dtype) {
    case SafetensorsDtype::kF32:
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case SafetensorsDtype::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = kernels::fp32_to_fp16(x[i]);
        if ((h & 0x7c00) == 0x7c00) fail(i, "beyond F16's range (use BF16)");
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case SafetensorsDtype::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = kernels::fp32_to_bf16(x[i]);
        if ((b & 0x7f80) == 0x7f80) fail(i, "beyond BF16's range");
        std::memcpy(dst + 2 * i, &b, 2);
      }
      return;
  }
}

}  // namespace

const char* safetensors_dtype_name(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return "F32";
    case SafetensorsDtype::kF16:
      return "F16";
    case SafetensorsDtype::kBF16:
      return "BF16";
  }
  return "?";
}

int safetensors_dtype_bytes(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::kF32 ? 4 : 2;
}

int64_t SafetensorsTensor::rows() const {
  return shape.size() >= 2 ? shape[0] : 1;
}

int64_t SafetensorsTensor::row_elements() const {
  int64_t n = 1;
  for (size_t i = shape.size() >= 2 ? 1 : 0; i < shape.size(); ++i) n *= shape[i];
  return n;
}

uint64_t SafetensorsTensor::bytes() const {
  return static_cast<uint64_t>(rows()) * static_cast<uint64_t>(row_elements()) *
         static_cast<uint64_t>(safetensors_dtype_bytes(dtype));
}

SafetensorsLayout safetensors_layout(std::span<const SafetensorsTensor> tensors,
                                     const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout layout;
  // ordered_json: __metadata__ first, then the tensors in data order (readers do not care; people
  // reading the header do).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  for (const SafetensorsTensor& t : tensors) {
    if (t.name.empty()) throw Error("a safetensors tensor needs a name");
    if (t.name == "__metadata__") throw Error("__metadata__ is not a tensor name");
    if (!names.insert(t.name).second) throw Error("tensor " + t.name + " is given twice");
    for (int64_t d : t.shape)
      if (d < 0) throw Error("tensor " + t.name + " has a negative dimension");
    if (!t.row) throw Error("tensor " + t.name + " has no values");
    const uint64_t begin = layout.data_bytes;
    layout.data_bytes += t.bytes();
    layout.offsets.emplace_back(begin, layout.data_bytes);
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {begin, layout.data_bytes}}};
  }
  layout.header = header.dump();
  // Spaces after the JSON (the format allows them) so that 8 + header bytes is a multiple of 8.
  const uint64_t used = 8 + layout.header.size();
  layout.header.append(static_cast<size_t>((kAlignment - used % kAlignment) % kAlignment), ' ');
  return layout;
}

void write_safetensors(const std::filesystem::path& path,
                       std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  const SafetensorsLayout layout = safetensors_layout(tensors, metadata);
  AtomicFile file(path);
  std::vector<uint8_t> buffer;
  const uint64_t n = layout.header.size();
  for (int i = 0; i < 8; ++i) buffer.push_back(static_cast<uint8_t>(n >> (8 * i)));
  buffer.insert(buffer.end(), layout.header.begin(), layout.header.end());
  std::vector<float> row;
  for (const SafetensorsTensor& t : tensors) {
    row.resize(static_cast<size_t>(t.row_elements()));
    for (int64_t r = 0; r < t.rows(); ++r) {
      t.row(r, row.data());
      append_row(t, r, row.data(), t.row_elements(), path, buffer);
      if (buffer.size() >= kFlushBytes) {
        file.write(buffer);
        buffer.clear();
      }
    }
  }
  file.write(buffer);
  file.commit();
}

}  // namespace tokenfab
