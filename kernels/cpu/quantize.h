#pragma once
// Conversions between f32 and the block formats. The scalar versions are the reference; the
// activation quantizer used on every matmul input also has an AVX2 version chosen at run time.

#include <cstdint>

#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels {

// Weight formats (tests, writers). `n` is a multiple of kQK.
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n);
void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);
// Any weight type into `dst` (row_bytes(type, n) bytes).
void quantize_row(WeightType type, const float* x, void* dst, int64_t n);

// Any weight type back to f32: the reference every kernel is tested against.
void dequantize_row(WeightType type, const void* src, float* y, int64_t n);

// Activations: one BlockQ8A per 32 values. `n` is a multiple of kQK.
void quantize_row_q8a(const float* x, BlockQ8A* y, int64_t n);
void quantize_row_q8a_scalar(const float* x, BlockQ8A* y, int64_t n);
void quantize_row_q8a_avx2(const float* x, BlockQ8A* y, int64_t n);

}  // namespace tokenfab::kernels
