#pragma once
// Device-side f32 → bf16 rounding shared by the ops that write bf16 (f32_to_bf16, the bf16
// outputs of rms_norm and silu_mul): the integer rounding of kernels::fp32_to_bf16
// (kernels/cpu/quant_types.h), so NaN payloads and ties come out the same. Include from .cu files
// only.

#include <cstdint>

namespace tokenfab::kernels::cuda_detail {

__device__ inline uint16_t to_bf16_bits(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Element i of an output that is f32 (out) or, when out16 is given, bf16 bits (to_bf16_bits).
__device__ inline void store_f32_or_bf16(float* out, uint16_t* out16, int64_t i, float v) {
  if (out16 != nullptr)
    out16[i] = to_bf16_bits(v);
  else
    out[i] = v;
}

}  // namespace tokenfab::kernels::cuda_detail
