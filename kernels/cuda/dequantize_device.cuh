#pragma once
// Device-side decoding of the GGUF weight formats, shared by the ops that read weights
// (dequantize, embedding). Each follows kernels::dequantize_row (kernels/cpu/quantize.h) with the
// same IEEE operations in the same order, so results are bit-identical to the CPU's. Include from
// .cu files only.

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels::cuda_detail {

__device__ inline float half_bits_to_float(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

__device__ inline float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// Q4_0: d·(q − 8). Explicit rounding (no contraction) as on the CPU.
__device__ inline float q4_0_value(float d, int q) {
  return __fmul_rn(d, static_cast<float>(q - 8));
}

// Q4_1: d·q + m, rounded after the multiply: a contracted fma(d, q, m) would differ from the CPU
// reference, which rounds d·q before adding m.
__device__ inline float q4_1_value(float d, float m, int q) {
  return __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m);
}

__device__ inline float q8_0_value(float d, int q) {
  return __fmul_rn(d, static_cast<float>(q));
}

// Element i of one row in `type`'s layout. row: the row's first byte (row_bytes(type, n) bytes).
// For block types element i is in block i / kQK at offset j = i % kQK: j < 16 is byte j's low
// nibble, j ≥ 16 byte j − 16's high nibble (Q4), or byte j (Q8_0).
template <WeightType kType>
__device__ inline float dequantize_element(const uint8_t* row, int64_t i) {
  if constexpr (kType == WeightType::F32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (kType == WeightType::F16) {
    return half_bits_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (kType == WeightType::BF16) {
    return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (kType == WeightType::Q4_0) {
    const BlockQ4_0& block = reinterpret_cast<const BlockQ4_0*>(row)[i / kQK];
    const int j = static_cast<int>(i % kQK);
    const int q = j < kQK / 2 ? (block.qs[j] & 0x0f) : (block.qs[j - kQK / 2] >> 4);
    return q4_0_value(half_bits_to_float(block.d), q);
  } else if constexpr (kType == WeightType::Q4_1) {
    const BlockQ4_1& block = reinterpret_cast<const BlockQ4_1*>(row)[i / kQK];
    const int j = static_cast<int>(i % kQK);
    const int q = j < kQK / 2 ? (block.qs[j] & 0x0f) : (block.qs[j - kQK / 2] >> 4);
    return q4_1_value(half_bits_to_float(block.d), half_bits_to_float(block.m), q);
  } else {
    static_assert(kType == WeightType::Q8_0, "unhandled weight type");
    const BlockQ8_0& block = reinterpret_cast<const BlockQ8_0*>(row)[i / kQK];
    return q8_0_value(half_bits_to_float(block.d), block.qs[i % kQK]);
  }
}

}  // namespace tokenfab::kernels::cuda_detail
