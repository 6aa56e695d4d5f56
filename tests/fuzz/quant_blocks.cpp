// The quant_blocks fuzz target (fuzz_targets.h): weight rows of every type through the block
// readers — describe_bad_block, dequantize_row, gemm_scalar — and its seeds.

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quantize.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/fuzz_targets.h"

namespace tokenfab::fuzz {

namespace {

namespace fs = std::filesystem;

// quant_blocks' input: a type byte, a row-length byte, then rows of that type's blocks.
constexpr int kWeightTypes = static_cast<int>(kernels::WeightType::IQ4_XS) + 1;
constexpr size_t kQuantHeader = 2;
constexpr int64_t kQuantMaxBlocks = 8;  // per row
constexpr int64_t kQuantMaxRows = 8;

// Elements per unit of quant_blocks' row length: a block, or kQK elements of a float type (the
// matmul takes rows of whole kQK blocks).
int64_t quant_unit(kernels::WeightType type) {
  return std::max(kernels::block_elements(type), kernels::kQK);
}

// The activations every quant_blocks row is multiplied by: sin(0.37·i + 0.1), no block of 32 all
// zero (so each Q8A block's scale is positive).
const float* quant_activations() {
  static const std::vector<float> x = [] {
    std::vector<float> v(static_cast<size_t>(kQuantMaxBlocks * kernels::kQK_K));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
    return v;
  }();
  return x.data();
}

// One row of a block type, decoded (y: n values) and multiplied (dot: gemm_scalar's value), held
// to what its scales say. A block whose fp16 scales are all finite decodes to finite values
// (|level| · scales stay far below f32's range) and one with a NaN or infinite scale to NaN or
// ±inf only (every value is a product with that scale); describe_bad_block names the first
// block of the second kind, or nothing when there is none; and the row's dot product with the
// activations is finite exactly when describe_bad_block finds nothing (each block's terms are
// products with its scales).
void check_quant_row(kernels::WeightType type, const std::string& bad, const std::vector<float>& y,
                     float dot) {
  const int64_t per = kernels::block_elements(type);
  const auto n = static_cast<int64_t>(y.size());
  const std::string name = kernels::weight_type_name(type);
  int64_t first_bad = -1;
  for (int64_t b = 0; b < n / per; ++b) {
    int64_t non_finite = 0;
    for (int64_t i = b * per; i < (b + 1) * per; ++i) non_finite += !std::isfinite(y[i]);
    if (non_finite != 0 && non_finite != per)
      finding("block " + std::to_string(b) + " of " + name + " decodes to " +
              std::to_string(non_finite) + " non-finite values of " + std::to_string(per));
    if (non_finite == per && first_bad < 0) first_bad = b;
  }
  if (first_bad < 0) {
    if (!bad.empty()) finding("describe_bad_block reports \"" + bad + "\" on finite blocks");
    if (!std::isfinite(dot))
      finding("gemm_scalar gives " + std::to_string(dot) + " on a row of finite " + name +
              " blocks");
    return;
  }
  const std::string want = "block " + std::to_string(first_bad) + " of " + name + ": ";
  if (bad.compare(0, want.size(), want) != 0)
    finding("describe_bad_block reports \"" + bad + "\" where block " + std::to_string(first_bad) +
            " of " + name + " decodes to non-finite values");
  if (std::isfinite(dot))
    finding("gemm_scalar gives a finite value on a " + name + " row with a non-finite scale");
}

}  // namespace

void quant_blocks(std::span<const uint8_t> bytes) {
  if (bytes.size() < kQuantHeader) return;
  const auto type = static_cast<kernels::WeightType>(bytes[0] % kWeightTypes);
  const int64_t n = quant_unit(type) * (1 + bytes[1] % kQuantMaxBlocks);
  const size_t stride = kernels::row_bytes(type, static_cast<uint64_t>(n));
  const auto rows =
      std::min(static_cast<int64_t>((bytes.size() - kQuantHeader) / stride), kQuantMaxRows);
  const bool quantized = kernels::is_block_quantized(type);
  // (n) activations in the matmul's layout for the type: Q8A blocks, or f32.
  std::vector<uint8_t> x(kernels::activation_row_bytes(type, n));
  if (quantized) {
    kernels::quantize_row_q8a_scalar(quant_activations(),
                                     reinterpret_cast<kernels::BlockQ8A*>(x.data()), n);
  } else {
    std::memcpy(x.data(), quant_activations(), x.size());
  }
  for (int64_t r = 0; r < rows; ++r) {
    // Each row in a buffer of its own exact size: a read past it is a sanitizer report.
    const uint8_t* at = bytes.data() + kQuantHeader + static_cast<size_t>(r) * stride;
    const std::vector<uint8_t> row(at, at + stride);
    const std::string bad = kernels::describe_bad_block(type, row.data(), n);
    std::vector<float> y(static_cast<size_t>(n));
    kernels::dequantize_row(type, row.data(), y.data(), n);
    std::vector<float> dot(1);
    kernels::gemm_scalar({.type = type,
                          .w = row.data(),
                          .w_stride = stride,
                          .x = x.data(),
                          .x_stride = x.size(),
                          .k = n,
                          .y = dot.data(),
                          .ldy = 1,
                          .rows = 1,
                          .cols = 1});
    if (!quantized) {
      if (!bad.empty()) finding("describe_bad_block reports \"" + bad + "\" on a float type");
      continue;
    }
    check_quant_row(type, bad, y, dot[0]);
  }
}

// For every type, three rows of two units quantized from a ramp; and two rows whose second block
// has a NaN or infinite scale (Q8_0's d, Q4_K's dmin).
void write_quant_block_seeds(const fs::path& dir) {
  const auto write = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream out(dir / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) throw Error("could not write a quant_blocks seed into " + dir.string());
  };
  const auto rows_of = [](kernels::WeightType type, int64_t n, int64_t rows) {
    const size_t stride = kernels::row_bytes(type, static_cast<uint64_t>(n));
    std::vector<uint8_t> bytes(kQuantHeader + stride * static_cast<size_t>(rows));
    bytes[0] = static_cast<uint8_t>(type);
    bytes[1] = 1;  // 1 + 1: two units per row
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < n; ++i)
        v[static_cast<size_t>(i)] = 0.01f * static_cast<float>((i * 7 + r * 13) % 41 - 20);
      kernels::quantize_row(type, v.data(), bytes.data() + kQuantHeader + stride * r, n);
    }
    return bytes;
  };
  for (int t = 0; t < kWeightTypes; ++t) {
    const auto type = static_cast<kernels::WeightType>(t);
    std::string name = kernels::weight_type_name(type);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    write(name + ".bin", rows_of(type, 2 * quant_unit(type), 3));
  }
  std::vector<uint8_t> q8 = rows_of(kernels::WeightType::Q8_0, 2 * kernels::kQK, 1);
  const uint16_t inf = 0x7c00, nan = 0x7e00;
  std::memcpy(q8.data() + kQuantHeader + sizeof(kernels::BlockQ8_0), &inf, 2);  // block 1's d
  write("q8_0-inf-scale.bin", q8);
  std::vector<uint8_t> q4k = rows_of(kernels::WeightType::Q4_K, 2 * kernels::kQK_K, 1);
  std::memcpy(
      q4k.data() + kQuantHeader + sizeof(kernels::BlockQ4_K) + offsetof(kernels::BlockQ4_K, dmin),
      &nan, 2);  // block 1's dmin
  write("q4_k-nan-dmin.bin", q4k);
}

}  // namespace tokenfab::fuzz
