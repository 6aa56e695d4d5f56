#pragma once
// Weight rows back to f32 on the GPU; mirrors kernels::dequantize_row (kernels/cpu/quantize.h)
// bit for bit. Declared with host-safe types only so plain C++ code can call it.

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// `type` is a kernels::WeightType as int: any of them (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q5_0,
// Q5_1, Q2_K … Q6_K, IQ4_NL, IQ4_XS).
// src: `rows` rows of n elements in that type's GGUF layout, packed back to back
//      (row_bytes(type, n) bytes each), device memory.
// y: (rows, n) device f32.
// n must be a multiple of block_elements(type): 32 for Q4_0 … Q5_1 and IQ4_NL, 256 for the
// K-quants and IQ4_XS. Asynchronous on `stream`.
// Throws std::invalid_argument for an unknown type or a bad n, std::runtime_error if the launch
// fails.
void launch_dequantize_rows(int type, const void* src, float* y, int64_t rows, int64_t n,
                            cudaStream_t stream);

}  // namespace tokenfab::kernels
