#pragma once
// The block GEMV's unpacking (gemv_blocks.h layouts), host and device: eight weights of a block
// from its quant words and its (d, m) pair. The GPU runs it inside the GEMV (gemv_chunks.cuh);
// the host runs the same code in a unit test against gemv_block_value, so the nibble and byte
// order is checked on every build machine, GPU or not.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels::gemv_detail {

__host__ __device__ inline float half_bits_to_float(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)));
#else
  return fp16_to_fp32(static_cast<uint16_t>(bits & 0xffffu));
#endif
}

// float(q)·d + m, the product and the sum each rounded in f32 (as kernels::dequantize_row).
__host__ __device__ inline float block_weight(float q, float d, float m) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(__fmul_rn(q, d), m);
#else
  volatile float product = q * d;  // two roundings on any host compiler (no contraction to FMA)
  return product + m;
#endif
}

// Weights 8g … 8g + 7 of a kQ4 block: quant words q (its 16 bytes, little-endian), scale pair
// (d low, m high). Byte j holds element j in its low nibble and element j + 16 in its high one,
// so g 0 and 1 are the low nibbles of bytes 0–7 and 8–15, g 2 and 3 their high nibbles.
__host__ __device__ inline void q4_block_weights(const uint32_t (&q)[4], uint32_t pair, int g,
                                                 float (&w)[8]) {
  const float d = half_bits_to_float(pair), m = half_bits_to_float(pair >> 16);
  const uint32_t lo = q[(g & 1) * 2], hi = q[(g & 1) * 2 + 1];
  const int shift = (g >> 1) * 4;
#ifdef __CUDACC__
#pragma unroll
#endif
  for (int t = 0; t < 4; ++t) {
    w[t] = block_weight(static_cast<float>((lo >> (8 * t + shift)) & 0xfu), d, m);
    w[4 + t] = block_weight(static_cast<float>((hi >> (8 * t + shift)) & 0xfu), d, m);
  }
}

// Weights 8g … 8g + 7 of a kQ8 block: quant words q (its 32 signed bytes, little-endian), scale
// pair (d low, m = 0 high): bytes 8g … 8g + 7.
__host__ __device__ inline void q8_block_weights(const uint32_t (&q)[8], uint32_t pair, int g,
                                                 float (&w)[8]) {
  const float d = half_bits_to_float(pair), m = half_bits_to_float(pair >> 16);
  const uint32_t lo = q[2 * g], hi = q[2 * g + 1];
#ifdef __CUDACC__
#pragma unroll
#endif
  for (int t = 0; t < 4; ++t) {
    w[t] = block_weight(static_cast<float>(static_cast<int8_t>((lo >> (8 * t)) & 0xffu)), d, m);
    w[4 + t] = block_weight(static_cast<float>(static_cast<int8_t>((hi >> (8 * t)) & 0xffu)), d, m);
  }
}

}  // namespace tokenfab::kernels::gemv_detail
