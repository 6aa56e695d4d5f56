#pragma once
// Tile kernels of the matmul: Y = X · Wᵀ for a range of weight rows.
//   W: `rows` rows of K elements of one WeightType, `w_stride` bytes apart (GGUF layout).
//   X: `cols` activation rows of K elements — BlockQ8A blocks for block-quantized weights
//      (quantize_row_q8a), f32 for F32 / F16 / BF16 weights — `x_stride` bytes apart.
//   Y: y[c * ldy + r] for r < rows, c < cols (f32).
// K is a multiple of kQK. The scalar version is the reference; the AVX2 version must match it
// within float rounding (same integer sums, different summation order).

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels {

struct GemmArgs {
  WeightType type;
  const uint8_t* w;
  size_t w_stride;
  const uint8_t* x;
  size_t x_stride;
  int64_t k;
  float* y;
  int64_t ldy;
  int64_t rows;
  int64_t cols;
};

// Bytes one activation row of K elements takes in the layout the kernels expect for `type`.
size_t activation_row_bytes(WeightType type, int64_t k);

void gemm_scalar(const GemmArgs& a);
void gemm_avx2(const GemmArgs& a);
void gemm(const GemmArgs& a);  // runtime dispatch

}  // namespace tokenfab::kernels
