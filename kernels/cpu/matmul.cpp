#include "kernels/cpu/matmul.h"

#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quantize.h"

namespace tokenfab::kernels {

uint8_t* ActivationScratch::reserve(size_t bytes) {
  if (buffer_.size() < bytes) buffer_.resize(bytes);
  return buffer_.data();
}

static void convert_rows(const float* x, int64_t ldx, int64_t k, int64_t c0, int64_t c1,
                         bool quantized, uint8_t* out, size_t out_stride) {
  for (int64_t c = c0; c < c1; ++c) {
    if (quantized) {
      quantize_row_q8a(x + c * ldx, reinterpret_cast<BlockQ8A*>(out + c * out_stride), k);
    } else {
      std::memcpy(out + c * out_stride, x + c * ldx, static_cast<size_t>(k) * sizeof(float));
    }
  }
}

void matmul(ThreadPool& pool, std::span<const MatmulJob> jobs, const float* x, int64_t ldx,
            int64_t k, int64_t cols, ActivationScratch& scratch) {
  if (jobs.empty() || cols == 0) return;
  const bool quantized = is_block_quantized(jobs[0].type);
  const size_t x_stride = activation_row_bytes(jobs[0].type, k);
  uint8_t* xq = scratch.reserve(x_stride * static_cast<size_t>(cols));
  if (cols < 8) {
    convert_rows(x, ldx, k, 0, cols, quantized, xq, x_stride);
  } else {
    pool.run([&](int t, int n) {
      int64_t c0, c1;
      ThreadPool::split(cols, 1, t, n, c0, c1);
      convert_rows(x, ldx, k, c0, c1, quantized, xq, x_stride);
    });
  }

  int64_t total_rows = 0;
  for (const auto& j : jobs) total_rows += j.rows;
  pool.run([&](int t, int n) {
    int64_t begin, end;
    ThreadPool::split(total_rows, 16, t, n, begin, end);
    int64_t offset = 0;  // first row of the current job in the concatenated row space
    for (const auto& j : jobs) {
      const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + j.rows);
      if (lo < hi) {
        const size_t w_stride = row_bytes(j.type, static_cast<uint64_t>(k));
        const int64_t r0 = lo - offset;
        gemm(GemmArgs{j.type, j.w + r0 * w_stride, w_stride, xq, x_stride, k, j.y + r0, j.ldy,
                      hi - lo, cols});
      }
      offset += j.rows;
    }
  });
}

}  // namespace tokenfab::kernels
