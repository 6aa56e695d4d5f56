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

}  // namespace tokenfab::kernels::cuda_detail
