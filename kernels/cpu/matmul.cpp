#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/repack.h"

namespace tokenfab::kernels {

uint8_t* ActivationScratch::reserve(size_t bytes) {
  if (buffer_.size() < bytes) buffer_.resize(bytes);
  return buffer_.data();
}

namespace {

enum class XLayout { F32, Q8A, Q8B };

// Rows [c0, c1) of x into the layout; Q8B rows are quantized into `tmp` (k/32 BlockQ8A) first.
void convert_rows(const float* x, int64_t ldx, int64_t k, int64_t c0, int64_t c1, XLayout layout,
                  uint8_t* out, size_t out_stride, BlockQ8A* tmp) {
  for (int64_t c = c0; c < c1; ++c) {
    uint8_t* row = out + c * out_stride;
    switch (layout) {
      case XLayout::F32:
        std::memcpy(row, x + c * ldx, static_cast<size_t>(k) * sizeof(float));
        break;
      case XLayout::Q8A:
        quantize_row_q8a(x + c * ldx, reinterpret_cast<BlockQ8A*>(row), k);
        break;
      case XLayout::Q8B:
        quantize_row_q8a(x + c * ldx, tmp, k);
        expand_q8b(tmp, reinterpret_cast<BlockQ8B*>(row), k / kQK);
        break;
    }
  }
}

// BlockQ8B pays when enough columns share each unpacked weight record and every job runs the Q4
// x8 AVX2 kernel; the VNNI kernel broadcasts from BlockQ8A rows for free.
XLayout choose_layout(std::span<const MatmulJob> jobs, int64_t cols, bool vnni) {
  if (!is_block_quantized(jobs[0].type)) return XLayout::F32;
  if (vnni || cols < kQ8BMinCols) return XLayout::Q8A;
  for (const auto& j : jobs) {
    if (j.group_rows != kX8Rows || (j.type != WeightType::Q4_0 && j.type != WeightType::Q4_1))
      return XLayout::Q8A;
  }
  return XLayout::Q8B;
}

}  // namespace

void matmul(ThreadPool& pool, std::span<const MatmulJob> jobs, const float* x, int64_t ldx,
            int64_t k, int64_t cols, ActivationScratch& scratch) {
  if (jobs.empty() || cols == 0) return;
  const bool vnni = use_avx512_vnni();
  for (const auto& j : jobs) {
    if (j.group_rows != 0 && j.group_rows != kX8Rows && j.group_rows != kX16Rows)
      throw std::invalid_argument("matmul: a job's weights packed in groups of " +
                                  std::to_string(j.group_rows) + " rows (expected 0, 8 or 16)");
    if (j.group_rows != 0 && !x8_supported(j.type))
      throw std::invalid_argument(std::string("matmul: ") + weight_type_name(j.type) +
                                  " weights have no packed layout (expected group_rows 0)");
    if (j.group_rows == kX16Rows && !vnni)
      throw std::invalid_argument("matmul: x16 weights need a CPU with AVX-512 VNNI");
    const int per_block = block_elements(j.type);
    if (is_block_quantized(j.type) && k % per_block != 0)
      throw std::invalid_argument("matmul: K = " + std::to_string(k) + " is not a multiple of " +
                                  weight_type_name(j.type) + "'s " + std::to_string(per_block) +
                                  "-element blocks");
  }
  const XLayout layout = choose_layout(jobs, cols, vnni);
  const size_t x_stride = layout == XLayout::Q8B ? static_cast<size_t>(k / kQK) * sizeof(BlockQ8B)
                                                 : activation_row_bytes(jobs[0].type, k);
  // The rows, then (Q8B) one row of BlockQ8A per thread; 32-byte aligned for the vector loads.
  const size_t rows_bytes = (x_stride * static_cast<size_t>(cols) + 31) / 32 * 32;
  const size_t tmp_bytes = layout == XLayout::Q8B ? activation_row_bytes(jobs[0].type, k) : 0;
  uint8_t* base = scratch.reserve(rows_bytes + tmp_bytes * static_cast<size_t>(pool.size()) + 32);
  uint8_t* xq = base + (32 - reinterpret_cast<uintptr_t>(base) % 32) % 32;
  const auto tmp_row = [&](int t) {
    return reinterpret_cast<BlockQ8A*>(xq + rows_bytes + tmp_bytes * t);
  };
  if (cols < 8) {
    convert_rows(x, ldx, k, 0, cols, layout, xq, x_stride, tmp_row(0));
  } else {
    pool.run([&](int t, int n) {
      int64_t c0, c1;
      ThreadPool::split(cols, 1, t, n, c0, c1);
      convert_rows(x, ldx, k, c0, c1, layout, xq, x_stride, tmp_row(t));
    });
  }

  // Every job is split over all threads in multiples of 8 rows (the x8 group size; 16 for x16),
  // so the threads get equal work and packed ranges start on a group boundary.
  pool.run([&](int t, int n) {
    for (const auto& j : jobs) {
      int64_t r0, r1;
      ThreadPool::split(j.rows, std::max(kX8Rows, j.group_rows), t, n, r0, r1);
      if (r0 >= r1) continue;
      if (j.group_rows != 0) {
        const size_t g_stride = packed_group_stride(j.type, j.group_rows, k);
        const uint8_t* w = j.w + r0 / j.group_rows * g_stride;
        const GemmArgs args{j.type, w, g_stride, xq, x_stride, k, j.y + r0, j.ldy, r1 - r0, cols};
        if (j.group_rows == kX16Rows) {
          gemm_x16_vnni(args);
        } else if (vnni) {
          gemm_x8_vnni(args);
        } else if (layout == XLayout::Q8B) {
          gemm_x8_q8b_avx2(args);
        } else {
          gemm_x8_avx2(args);
        }
      } else {
        const size_t w_stride = row_bytes(j.type, static_cast<uint64_t>(k));
        gemm(GemmArgs{j.type, j.w + r0 * w_stride, w_stride, xq, x_stride, k, j.y + r0, j.ldy,
                      r1 - r0, cols});
      }
    }
  });
}

}  // namespace tokenfab::kernels
