#pragma once
// Conversions between f32 and the block formats. The scalar versions are the reference; the
// activation quantizer used on every matmul input also has an AVX2 version chosen at run time.

#include <cstdint>
#include <string>

#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels {

// Weight formats (tests, writers, `tokenfab-cli quantize`). `n` is a multiple of the type's
// block_elements: kQK (32) for Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, IQ4_NL, kQK_K (256) for the
// K-quants and IQ4_XS; a partial block at the end is not written. Deterministic (the same input
// gives the same bytes on every machine and thread count) and allocation-free.
//
// Q4_0, Q4_1, Q8_0: plain max-scaling (the extreme value on the last level).
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n);
void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);
// The rest search each block's (or sub-block's) scale, and min, for the least squared error
// (kernels/cpu/quant_search.h); the K-quants and IQ4_XS then quantize the sub-block scales to
// their 4/6/8 bits under an fp16 super-block scale and refit that (quantize_k.cpp).
void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n);
void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n);
void quantize_row_q2_k(const float* x, BlockQ2_K* y, int64_t n);
void quantize_row_q3_k(const float* x, BlockQ3_K* y, int64_t n);
void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n);
void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n);
void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n);
void quantize_row_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t n);
void quantize_row_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t n);
// Any weight type into `dst` (row_bytes(type, n) bytes).
void quantize_row(WeightType type, const float* x, void* dst, int64_t n);

// Any weight type back to f32: the reference every kernel is tested against. Each block type
// does ggml's arithmetic in ggml's order, so the values equal ggml's (and the `gguf` Python
// package's) bit for bit: tests/data/quant_golden.json. `n` as for quantize_row.
void dequantize_row(WeightType type, const void* src, float* y, int64_t n);
void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t n);
void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t n);
void dequantize_row_q2_k(const BlockQ2_K* x, float* y, int64_t n);
void dequantize_row_q3_k(const BlockQ3_K* x, float* y, int64_t n);
void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n);
void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n);
void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n);
void dequantize_row_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t n);
void dequantize_row_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t n);

// For loaders: "" when every fp16 scale of the row's blocks (d, and dmin or m where the format
// has one) is finite, else a short description of the first that is not, e.g.
// "block 3 of Q4_K: dmin is nan (fp16 0x7e00)". The float types have no scales: always "".
// Reads two or four bytes per block; `row` holds row_bytes(type, n) bytes.
std::string describe_bad_block(WeightType type, const void* row, int64_t n);

// Activations: one BlockQ8A per 32 values. `n` is a multiple of kQK.
void quantize_row_q8a(const float* x, BlockQ8A* y, int64_t n);
void quantize_row_q8a_scalar(const float* x, BlockQ8A* y, int64_t n);
void quantize_row_q8a_avx2(const float* x, BlockQ8A* y, int64_t n);

}  // namespace tokenfab::kernels
