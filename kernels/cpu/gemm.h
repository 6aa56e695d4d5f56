#pragma once
// Tile kernels of the matmul: Y = X · Wᵀ for a range of weight rows.
//   W: `rows` rows of K elements of one WeightType, `w_stride` bytes apart (GGUF layout).
//   X: `cols` activation rows of K elements — BlockQ8A blocks for block-quantized weights
//      (quantize_row_q8a), f32 for F32 / F16 / BF16 weights — `x_stride` bytes apart.
//   Y: y[c * ldy + r] for r < rows, c < cols (f32).
// K is a multiple of block_elements(type) (kQK for the float types). The scalar version is the
// reference (gemm.cpp states each type's formula); the AVX2 version must match it within float
// rounding (same integer sums, different summation order).

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

// The part of gemm_avx2 for the super-block types (Q2_K … Q6_K, IQ4_XS; gemm_kquants_avx2.cpp).
void gemm_kquants_avx2(const GemmArgs& a);

// For each of nb activation blocks, the sums of its two halves' 16 values as one int32:
// low 16 bits Σ q[0..15], high 16 bits Σ q[16..31] (each |Σ| ≤ 2032), the operand the kernels of
// the 16-element sub-block types multiply per-row pairs of int16 against (vpmaddwd).
void q8a_pair_sums(const BlockQ8A* x, int64_t nb, int32_t* out);

// Per-block integers of the activations that the packed kernels of some types add to their sums,
// for all a.cols columns of a (BlockQ8A rows): k/32 int32 per column, column c's at c·k/32.
//   Pairs:      q8a_pair_sums (Q6_K's and Q3_K's level offsets, Q2_K's minimums);
//   Offsets128: −128·Σq (weights offset by +128 to unsigned bytes for vpdpbusd: Q8_0, IQ4).
// In a buffer of the calling thread, valid until its next call. (Here, in a file compiled for
// the baseline instruction set, so that the buffer's code is never one a narrower CPU lacks.)
enum class ActivationSums { Pairs, Offsets128 };
const int32_t* activation_sums(const GemmArgs& a, ActivationSums kind);

}  // namespace tokenfab::kernels
