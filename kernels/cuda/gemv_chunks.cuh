#pragma once
// Device code of the decode GEMV (gemv.cu): what one lane loads of one weight row per step, for
// each weight layout (GemvWeights), and how that chunk becomes f32 weights, eight at a time.
//   kBf16: 8 weights, one 16-byte load;
//   kQ4:   one block of 32 weights, one 16-byte load of quants and one 4-byte scale pair;
//   kQ8:   one block of 32 weights, two 16-byte loads of quants and one 4-byte scale pair.
// Block weights are float(q)·d + m, the product and the sum each rounded in f32: the values of
// kernels::dequantize_row (gemv_blocks.h), exactly.

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/gemv.cuh"

namespace tokenfab::kernels::gemv_detail {

template <GemvWeights F>
struct Chunk;

template <>
struct Chunk<GemvWeights::kBf16> {
  static constexpr int kElems = 8;
  uint4 v;

  __device__ void load(const GemvArgs& a, int64_t row, int64_t c) {
    v = __ldg(reinterpret_cast<const uint4*>(a.w + row * a.k) + c);
  }
  // Weights 8g … 8g + 7 of the chunk (g = 0 only).
  __device__ void weights(int, float (&w)[8]) const {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      w[2 * t] = __uint_as_float(u[t] << 16);
      w[2 * t + 1] = __uint_as_float(u[t] & 0xffff0000u);
    }
  }
  __device__ static const void* row_start(const GemvArgs& a, int64_t row) {
    return a.w + row * a.k;
  }
  __device__ static int64_t row_bytes(const GemvArgs& a) {
    return a.k * 2;
  }
};

// d in the low half of the pair, m in the high one.
__device__ inline void scale_pair(uint32_t pair, float& d, float& m) {
  d = __half2float(__ushort_as_half(static_cast<unsigned short>(pair & 0xffffu)));
  m = __half2float(__ushort_as_half(static_cast<unsigned short>(pair >> 16)));
}

__device__ inline float block_weight(float q, float d, float m) {
  return __fadd_rn(__fmul_rn(q, d), m);
}

template <>
struct Chunk<GemvWeights::kQ4> {
  static constexpr int kElems = 32;
  uint4 v;
  uint32_t pair;

  __device__ void load(const GemvArgs& a, int64_t row, int64_t c) {
    v = __ldg(reinterpret_cast<const uint4*>(a.q + row * (a.k / 2)) + c);
    pair = __ldg(a.scales + row * (a.k / 32) + c);
  }
  // Weights 8g … 8g + 7: the low nibbles of bytes 0–7 (g 0) and 8–15 (g 1), then the high nibbles
  // of the same bytes (g 2 and 3).
  __device__ void weights(int g, float (&w)[8]) const {
    float d, m;
    scale_pair(pair, d, m);
    const uint32_t lo = (g & 1) ? v.z : v.x, hi = (g & 1) ? v.w : v.y;
    const int shift = (g >> 1) * 4;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      w[t] = block_weight(static_cast<float>((lo >> (8 * t + shift)) & 0xfu), d, m);
      w[4 + t] = block_weight(static_cast<float>((hi >> (8 * t + shift)) & 0xfu), d, m);
    }
  }
  __device__ static const void* row_start(const GemvArgs& a, int64_t row) {
    return a.q + row * (a.k / 2);
  }
  __device__ static int64_t row_bytes(const GemvArgs& a) {
    return a.k / 2;
  }
};

template <>
struct Chunk<GemvWeights::kQ8> {
  static constexpr int kElems = 32;
  uint4 v0, v1;
  uint32_t pair;

  __device__ void load(const GemvArgs& a, int64_t row, int64_t c) {
    const uint4* p = reinterpret_cast<const uint4*>(a.q + row * a.k) + 2 * c;
    v0 = __ldg(p);
    v1 = __ldg(p + 1);
    pair = __ldg(a.scales + row * (a.k / 32) + c);
  }
  // Weights 8g … 8g + 7: bytes 8g … 8g + 7 of the block, signed.
  __device__ void weights(int g, float (&w)[8]) const {
    float d, m;
    scale_pair(pair, d, m);
    const uint4& v = g < 2 ? v0 : v1;
    const uint32_t lo = (g & 1) ? v.z : v.x, hi = (g & 1) ? v.w : v.y;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      w[t] = block_weight(static_cast<float>(static_cast<int8_t>((lo >> (8 * t)) & 0xffu)), d, m);
      w[4 + t] =
          block_weight(static_cast<float>(static_cast<int8_t>((hi >> (8 * t)) & 0xffu)), d, m);
    }
  }
  __device__ static const void* row_start(const GemvArgs& a, int64_t row) {
    return a.q + row * a.k;
  }
  __device__ static int64_t row_bytes(const GemvArgs& a) {
    return a.k;
  }
};

}  // namespace tokenfab::kernels::gemv_detail
