#include "kernels/cpu/matmul.h"

#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/repack.h"

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

  // Every job is split over all threads in multiples of 8 rows (the x8 group size), so the
  // threads get equal work and x8 ranges start on a group boundary.
  pool.run([&](int t, int n) {
    for (const auto& j : jobs) {
      int64_t r0, r1;
      ThreadPool::split(j.rows, kX8Rows, t, n, r0, r1);
      if (r0 >= r1) continue;
      if (j.x8) {
        const size_t g_stride = x8_group_stride(j.type, k);
        gemm_x8_avx2(GemmArgs{j.type, j.w + r0 / kX8Rows * g_stride, g_stride, xq, x_stride, k,
                              j.y + r0, j.ldy, r1 - r0, cols});
      } else {
        const size_t w_stride = row_bytes(j.type, static_cast<uint64_t>(k));
        gemm(GemmArgs{j.type, j.w + r0 * w_stride, w_stride, xq, x_stride, k, j.y + r0, j.ldy,
                      r1 - r0, cols});
      }
    }
  });
}

}  // namespace tokenfab::kernels
