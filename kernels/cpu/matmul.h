#pragma once
// Threaded matmul over weights kept in their stored (quantized) form:
//   for each job j:  Y_j (cols × rows_j) = X (cols × k) · W_jᵀ
// Several jobs sharing one input (Q/K/V, gate/up) run in one parallel region, their rows split
// evenly over the threads. X is converted once to the layout the kernels read (Q8A blocks for
// quantized weights — Q8B, their broadcast form, for 64 or more columns when every job is an x8
// Q4 matrix and the CPU has no AVX-512 VNNI — f32 otherwise). x8 jobs run the VNNI kernel where
// the CPU has it, the AVX2 ones otherwise: the same results bit for bit.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/quant_types.h"
#include "kernels/cpu/thread_pool.h"

namespace tokenfab::kernels {

struct MatmulJob {
  WeightType type;
  const uint8_t* w;  // rows × row_bytes(type, k), or row groups in the x8 layout (repack.h)
  int64_t rows;
  float* y;  // (cols, ldy): y[c * ldy + r]
  int64_t ldy;
  // Rows per packed group of w: 0 for the GGUF rows; 8 for the x8 layout (rows % 8 == 0, AVX2
  // kernels), 16 for x16 (rows % 16 == 0, AVX-512 VNNI only; repack.h).
  int group_rows = 0;
};

// Reusable conversion buffer for X; grows to the largest input seen, never shrinks.
class ActivationScratch {
 public:
  uint8_t* reserve(size_t bytes);

 private:
  std::vector<uint8_t> buffer_;
};

// x: (cols, ldx) f32. All jobs must share one activation layout (all quantized or all float).
// K must be a multiple of each quantized job's block_elements (32, or 256 for the super-block
// types; the model loader checks this per matrix), and a packed job's type x8_supported:
// std::invalid_argument otherwise.
void matmul(ThreadPool& pool, std::span<const MatmulJob> jobs, const float* x, int64_t ldx,
            int64_t k, int64_t cols, ActivationScratch& scratch);

}  // namespace tokenfab::kernels
