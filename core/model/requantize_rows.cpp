#include "core/model/requantize_rows.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cpu/quantize.h"

namespace tokenfab {

namespace {

// Below this many elements a matrix is converted on the calling thread only.
constexpr int64_t kParallelElements = int64_t{1} << 18;

}  // namespace

void requantize_rows(kernels::WeightType from, const uint8_t* src, kernels::WeightType to,
                     uint8_t* dst, int64_t rows, int64_t cols, int threads) {
  const uint64_t src_bytes = kernels::row_bytes(from, static_cast<uint64_t>(cols));
  const uint64_t dst_bytes = kernels::row_bytes(to, static_cast<uint64_t>(cols));
  if (from == to) {
    std::memcpy(dst, src, src_bytes * static_cast<uint64_t>(rows));
    return;
  }
  const auto convert = [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));  // (cols) f32 between the two types
    for (int64_t r = begin; r < end; ++r) {
      kernels::dequantize_row(from, src + static_cast<uint64_t>(r) * src_bytes, row.data(), cols);
      kernels::quantize_row(to, row.data(), dst + static_cast<uint64_t>(r) * dst_bytes, cols);
    }
  };
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t team = rows * cols < kParallelElements ? 1 : std::clamp<int64_t>(threads, 1, rows);
  if (team == 1) {
    convert(0, rows);
    return;
  }
  std::vector<std::jthread> workers;
  for (int64_t t = 1; t < team; ++t)
    workers.emplace_back(convert, rows * t / team, rows * (t + 1) / team);
  convert(0, rows / team);
}

}  // namespace tokenfab
